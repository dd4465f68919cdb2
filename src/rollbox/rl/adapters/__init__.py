"""Adapters that plug rollbox episodes into RL frameworks: verl tools (`verl_tool`), TRL's
`environment_factory` (`trl_env`) and mini-swe-agent environments (`mini_swe_agent`); and Harbor's environment
(`harbor`), which runs Harbor's trials in rollbox sandboxes."""
