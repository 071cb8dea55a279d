"""Built-in generation backends."""
