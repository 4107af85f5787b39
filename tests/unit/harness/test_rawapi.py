"""The harness's typed boundary to the official client (kubeharness/rawapi.py): raw calls ask for the
undecoded answer, JSON-object answers are checked before use, and a TokenRequest answer without a
token is refused by name rather than handed on as the string "None"."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import AuthenticationV1TokenRequest, V1TokenRequestStatus

from kubeharness.rawapi import call, items, json_object, read_json, send
from kubeharness.tokens import token_of


class _Recorder:
    def __init__(self, body: bytes) -> None:
        self.body = body
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def method(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return SimpleNamespace(data=self.body, release_conn=lambda: None)


def test_send_and_read_json_ask_for_the_undecoded_answer_and_pass_the_rest_through() -> None:
    rec = _Recorder(json.dumps({"items": [{"metadata": {"name": "n1"}}]}).encode())
    assert read_json(rec.method, "ns", label_selector="a=b") == {"items": [{"metadata": {"name": "n1"}}]}
    assert send(rec.method, {"kind": "Pod"}).data == rec.body
    assert rec.calls == [(("ns",), {"label_selector": "a=b", "_preload_content": False}),
                         (({"kind": "Pod"},), {"_preload_content": False})]


def test_call_passes_a_json_object_body_as_it_is_and_returns_the_answer() -> None:
    seen: list[object] = []

    def create(body: object) -> str:
        seen.append(body)
        return "created"

    body = {"metadata": {"name": "x"}}
    assert call(create, body) == "created"
    assert seen == [body] and seen[0] is body


@pytest.mark.parametrize("value", [[{"items": []}], "items", None, 3])
def test_an_answer_that_is_not_a_json_object_is_refused_by_name(value: object) -> None:
    with pytest.raises(TypeError, match=rf"workloads: expected a JSON object, got {type(value).__name__}"):
        items(value, "workloads")
    with pytest.raises(TypeError, match="clusterqueue: expected a JSON object"):
        json_object(value, "clusterqueue")


def test_items_of_a_list_answer() -> None:
    assert items({"items": [{"a": 1}, {"b": 2}], "metadata": {}}, "w") == [{"a": 1}, {"b": 2}]
    with pytest.raises(KeyError):
        items({"metadata": {}}, "w")


@pytest.mark.parametrize("status", [None, V1TokenRequestStatus(token="", expiration_timestamp="2026-01-01T00:00:00Z")])
def test_a_token_request_answered_without_a_token_is_an_error(status: V1TokenRequestStatus | None) -> None:
    req = AuthenticationV1TokenRequest(spec={"audiences": []}, status=status)
    with pytest.raises(RuntimeError, match="without a token"):
        token_of(req)


def test_the_token_of_a_token_request() -> None:
    status = V1TokenRequestStatus(token="abc.def", expiration_timestamp="2026-01-01T00:00:00Z")
    assert token_of(AuthenticationV1TokenRequest(spec={"audiences": []}, status=status)) == "abc.def"
