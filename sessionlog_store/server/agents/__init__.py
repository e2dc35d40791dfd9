"""Agents answer a chat turn by writing into an in-flight message. Import server.domain (the store's API) only; never server.edge."""
from sessionlog_store.server.agents.base import Agent as Agent
from sessionlog_store.server.agents.base import load_agents as load_agents
from sessionlog_store.server.agents.demo import DemoAgent as DemoAgent
