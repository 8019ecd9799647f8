"""A sweep's children named after their point, so the dashboard tells them apart.

Polyaxon gives every child of a matrix the component's name, and a templated `name:` stays literal. The
child itself can read its matrix (the parent's compiled spec) and its own inputs, so a managed run renames
itself `max_num_seqs-8` and tags itself `max_num_seqs=8`. Naming is a convenience: a failure leaves the
shared name and the measurement goes on.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from harness.errors import HarnessError
from harness.polyaxon_client import polyaxon_call


def name_matrix_child(owner: str, project: str, run_uuid: str) -> str | None:
    """Rename and tag a run after its point in the matrix that created it; returns the name, or None when
    the run is not a matrix child (or the API could not be asked)."""
    from polyaxon.client import RunClient

    try:
        child = RunClient(owner=owner, project=project, run_uuid=run_uuid)
        polyaxon_call("cannot read this run", child.refresh_data)
        pipeline = child.run_data.pipeline
        if pipeline is None or pipeline.kind != "matrix":
            return None
        parent = RunClient(owner=owner, project=project, run_uuid=pipeline.uuid)
        polyaxon_call("cannot read the sweep", parent.refresh_data)
        swept = swept_inputs(json.loads(parent.run_data.content).get("matrix") or {})
        point = {name: child.run_data.inputs.get(name) for name in swept}
        name = "-".join(f"{limit}-{value}" for limit, value in point.items())
        if not name:
            return None
        polyaxon_call("cannot rename this run", lambda: child.set_name(name, async_req=False))
        polyaxon_call("cannot tag this run",
                      lambda: child.log_tags([f"{limit}={value}" for limit, value in point.items()], async_req=False))
        return name
    except HarnessError as error:
        print(f"warning: the run keeps the sweep's shared name: {error}", file=sys.stderr)
        return None


def swept_inputs(matrix: dict[str, Any]) -> list[str]:
    """The inputs a matrix varies: a mapping's keys, or a grid's (or any search's) params."""
    if matrix.get("kind") == "mapping":
        return sorted({name for values in matrix.get("values") or [] for name in values})
    return sorted(matrix.get("params") or {})
