#!/usr/bin/env bash
# Deletes the kind cluster of the end-to-end scripts.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need kind
kind delete cluster --name "$CLUSTER"
