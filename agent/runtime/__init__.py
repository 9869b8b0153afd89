"""The agent runtime: executor, pipeline, model clients and tools; the knowledge that the tools search is
`agent.knowledge`."""
