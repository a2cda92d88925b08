"""Tools for the chat app: the MCP servers it starts and calls (servers.py), a chat's choice of tools
(choice.py), and a call's result as the text the model reads back (results.py). The agent loop that ties
them to the answers is chat/agent.py. No Textual here; the MCP SDK is imported only in the servers' thread.
"""
