"""The agent loop: the model protocol, scripted and OpenAI-compatible models, tools, roles."""
