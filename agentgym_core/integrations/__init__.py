"""Adapters to other training libraries: `trl` (TRL's `environment_factory`)."""
