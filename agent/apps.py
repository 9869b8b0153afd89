from django.apps import AppConfig


class AgentConfig(AppConfig):
    """The diagnosis agent: the runtime that executes runs (router, agent loop, AI Ops planner and executor,
    guards, release), its tools, the knowledge base it searches and the AI Ops clients. No models of its
    own: it writes through the record (`audit`) onto the identity app's rows (`diagnosis`)."""

    name = "agent"
    verbose_name = "Agent"

    def ready(self) -> None:
        from agent import checks  # noqa: F401  (registers the runtime's system checks)
        from agent.runtime import resume_state  # noqa: F401  (erases saved resume states on reasoning purges)
        from agent.runtime.live import live_followers
        from agent.runtime.supervisor import running_count
        from telemetry.metrics import register_process_gauge

        register_process_gauge(
            "diagnosis_process_active_runs", "Runs this process is executing now.", running_count
        )
        register_process_gauge(
            "diagnosis_process_live_followers",
            "Live run followers (chat streams, WebSocket subscriptions) in this process.",
            live_followers,
        )
