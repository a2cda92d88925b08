"""A model choice turned into answered tokens, for the chat app, `serve` and `run` alike.

Loading (model_source, model_manager, loader, progress, terminal_load, memory), answering (session,
answering, prompt, detokenize, stops, live_stats, bridge) and the OpenAI wire protocol (openai_protocol,
endpoint). It knows nothing of chats: a conversation, its history and the app's backends are chat/'s.
"""
