"""The committed kernels (kernels_generated/) are exactly what the generator produces today: a change to the
generator, the graphs or the toolchain shows up as a diff to review and commit, never silently."""
from __future__ import annotations

import pytest

from mugraph.codegen.regen import DEFAULT_ROOT
from mugraph.regen import regenerate


def test_committed_kernels_are_what_the_generator_produces():
    if not (DEFAULT_ROOT / "README.md").is_file():
        pytest.skip("kernels_generated/ has not been generated yet: run `mugraph regen` "
                    "(mugraph.codegen.regen.regenerate()) and commit the result")
    stale = regenerate(check=True)
    listing = "\n  ".join(str(p.relative_to(DEFAULT_ROOT)) for p in stale)
    assert not stale, (f"{len(stale)} file(s) in kernels_generated/ differ from what the generator produces "
                       f"today:\n  {listing}\nrun `mugraph regen`, review the diff and commit it")
