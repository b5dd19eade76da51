"""The engine explains itself: schema-versioned events built from the engine's
publication points, recordings, and the benchmark hook. Free of any web framework."""
from kvscope.instrumentation.schema import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION", "Clock", "Instrumentation", "RequestLabel", "WatchSpec", "attach_for_bench"]


def __getattr__(name):
    # the observer pulls in torch; the schema alone must not
    if name == "attach_for_bench":
        from kvscope.instrumentation.bench import attach_for_bench
        return attach_for_bench
    if name in ("Clock", "Instrumentation", "RequestLabel"):
        from kvscope.instrumentation import observer
        return getattr(observer, name)
    if name == "WatchSpec":
        from kvscope.instrumentation.watch import WatchSpec
        return WatchSpec
    raise AttributeError(name)
