#!/usr/bin/env python3
"""Extracts the OpenAPI schemas the Helm chart test checks mesh resources
against (tests/tests/helm_chart.rs) from upstream CRD files, without their
descriptions, into tests/fixtures/crd-schemas/<kind>.<group>.<version>.json.

  scripts/vendor-crd-schemas.py ISTIO_API_CHECKOUT ENVOY_GATEWAY_CHECKOUT

ISTIO_API_CHECKOUT: github.com/istio/api (kubernetes/customresourcedefinitions.gen.yaml)
ENVOY_GATEWAY_CHECKOUT: github.com/envoyproxy/gateway
  (charts/gateway-helm/charts/crds/crds/{generated/*.yaml,gatewayapi-crds.yaml})
"""
import json
import pathlib
import sys

import yaml

WANTED = {
    ("networking.istio.io", "EnvoyFilter", "v1alpha3"),
    ("networking.istio.io", "VirtualService", "v1"),
    ("gateway.envoyproxy.io", "EnvoyExtensionPolicy", "v1alpha1"),
    ("gateway.envoyproxy.io", "EnvoyPatchPolicy", "v1alpha1"),
    ("gateway.envoyproxy.io", "BackendTrafficPolicy", "v1alpha1"),
    ("gateway.networking.k8s.io", "HTTPRoute", "v1"),
}


def strip(node):
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def main():
    istio, eg = map(pathlib.Path, sys.argv[1:3])
    crd_dir = eg / "charts/gateway-helm/charts/crds/crds"
    files = [istio / "kubernetes/customresourcedefinitions.gen.yaml", crd_dir / "gatewayapi-crds.yaml"]
    files += sorted((crd_dir / "generated").glob("*.yaml"))
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/crd-schemas"
    out.mkdir(parents=True, exist_ok=True)
    found = set()
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for v in doc["spec"]["versions"]:
                key = (group, kind, v["name"])
                if key in WANTED and key not in found:
                    found.add(key)
                    schema = strip(v["schema"]["openAPIV3Schema"])
                    path = out / f"{kind}.{group}.{v['name']}.json"
                    path.write_text(json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
                    print(f"{path.name}: {path.stat().st_size} bytes")
    missing = WANTED - found
    if missing:
        sys.exit(f"not found: {sorted(missing)}")


if __name__ == "__main__":
    main()
