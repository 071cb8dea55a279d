"""Running stages: training, evaluation and pipelines of both."""
