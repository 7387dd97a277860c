"""A CPU stand-in for ``omni_stream.runtime.cuda_graphs.GraphSet``, so the graph paths run where CUDA does not."""

from __future__ import annotations


class EagerGraphs:
    """Stands in for GraphSet on CPU: "capture" runs the step once, "replay" runs it again at the same key."""

    def __init__(self, fn) -> None:
        self.fn, self.graphs = fn, {}
        self.replayed: list = []  # the keys replayed, in order

    def __contains__(self, key) -> bool:
        return key in self.graphs

    def __len__(self) -> int:
        return len(self.graphs)

    def capture(self, key) -> None:
        self.fn(*key)
        self.graphs[key] = True

    def capture_all(self, keys, progress=None, desc="") -> float:
        for key in keys:
            self.capture(key)
        return 0.0

    def replay(self, key) -> bool:
        if key not in self.graphs:
            return False
        self.fn(*key)
        self.replayed.append(key)
        return True

    def clear(self) -> None:
        self.graphs.clear()
