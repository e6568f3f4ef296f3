"""What the sensor, the operators and the decorators share around their decisions: argument checks,
reviews, usage across tries, the ``decisions`` history, event payloads, deadlines, metrics."""
