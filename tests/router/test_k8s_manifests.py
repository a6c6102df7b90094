"""deploy/kubernetes validates against Kubernetes' own OpenAPI schemas (kubernetes-validate,
strict: unknown fields are errors), and says what docs/router.md says it says."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

FOLDER = Path(__file__).parents[2] / "deploy" / "kubernetes"
DOCS = [doc for path in sorted(FOLDER.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("doc", DOCS, ids=[f"{d['kind']}/{d['metadata']['name']}" for d in DOCS])
def test_manifest_is_valid(doc):
    kubernetes_validate.validate(doc, "1.33.0", strict=True)


def test_a_mistake_is_caught():
    broken = yaml.safe_load((FOLDER / "hpa.yaml").read_text())
    broken["spec"]["metrics"][0]["external"]["target"]["averageValu"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.33.0", strict=True)


def test_the_set_wires_readiness_scaling_and_the_registry():
    by_kind = {(d["kind"], d["metadata"]["name"]): d for d in DOCS}
    worker = by_kind[("StatefulSet", "kvserve-worker")]["spec"]["template"]["spec"]["containers"][0]
    assert worker["readinessProbe"]["httpGet"]["path"] == "/health"
    assert any(a.startswith("--kv-events-config=") for a in worker["args"])
    hpa = by_kind[("HorizontalPodAutoscaler", "kvserve-worker")]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "kvserve-worker"
    assert hpa["metrics"][0]["external"]["metric"]["name"] == "kvserve_router_desired_replicas"
    assert hpa["metrics"][0]["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    registry = yaml.safe_load(by_kind[("ConfigMap", "kvserve-router")]["data"]["workers.yaml"])
    from kvserve.router.registry import WorkerRegistry

    entries = WorkerRegistry.model_validate(registry).workers
    assert len(entries) == hpa["maxReplicas"] and entries[0].url == "http://kvserve-worker-0.kvserve-worker:8000"
    router = by_kind[("Deployment", "kvserve-router")]["spec"]["template"]["spec"]["containers"][0]
    assert "--max-replicas=6" in router["args"] and router["readinessProbe"]["httpGet"]["path"] == "/health"
