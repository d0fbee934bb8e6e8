"""OpenAI-compatible server (placeholder docstring, completed below)."""

from engine.serve.exchange import ExchangeSink, ServedChoice, ServedExchange
from engine.serve.running import RunningServer, ServeSetupError, start_server
from engine.serve.service import ServeOptions

__all__ = ["ExchangeSink", "RunningServer", "ServeOptions", "ServeSetupError", "ServedChoice", "ServedExchange",
           "start_server"]
