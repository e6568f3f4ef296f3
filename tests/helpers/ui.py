"""The Dags the UI test opens in the browser (``tests/ui/dags``)."""

UI_DAG_ID = "sz_ui_review"
TIMELINE_DAG_ID = "sz_ui_timeline"
