"""Running the numbered notebooks: ``sparkbook run`` (runner), papermill's engine, Ctrl-C, and
the front page."""
