"""What a researcher sees: figures, widgets, the Markdown report, the notebooks' facade and runner."""
