"""Datasets: expert trajectories and the AgentTraj format."""
