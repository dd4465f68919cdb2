"""RL on rollbox: tasks with verifiable rewards, environments, rollout collection, trajectories, adapters."""
