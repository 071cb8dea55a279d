"""Run tracking: MLflow (`mlflow_tracker`), the UI command (`ui`), terminal output (`console`).

Nothing is imported here so `import agentgym_core.tracking.console` stays fast.
"""
