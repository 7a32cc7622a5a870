"""The search: enumerate μGraphs with abstract-expression pruning, verify, rank with a cost model.

`search(spec, config)` returns a `SearchResult` (`.best`, `.candidates`, `.report`).
"""
from mugraph.search.config import SearchConfig
from mugraph.search.context import StopReason
from mugraph.search.result import Candidate, SearchReport, SearchResult
from mugraph.search.runner import search

__all__ = ["Candidate", "SearchConfig", "SearchReport", "SearchResult", "StopReason", "search"]
