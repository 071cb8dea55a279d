"""Evaluation metrics: success rate, reward, Avg@k and Pass@k over trajectories."""
