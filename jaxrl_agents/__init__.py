"""jaxrl_agents: JAX-native multi-turn RL for tool-using LLM agents."""

__version__ = "0.1.0"
