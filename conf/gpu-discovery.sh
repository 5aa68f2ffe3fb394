#!/usr/bin/env bash
# Fake GPU discovery for tests on machines without GPUs. In local-cluster mode every Worker
# runs this inside the driver's JVM; each call claims the next free number under a directory
# private to that JVM, so the Workers report distinct "GPUs" and the tests can check that each
# task's assignment reaches its rank.
dir="${TMPDIR:-/tmp}/sparktrain-fake-gpus.$PPID"
mkdir -p "$dir"
n=0
until mkdir "$dir/$n" 2>/dev/null; do n=$((n + 1)); done
echo "{\"name\": \"gpu\", \"addresses\": [\"$n\"]}"
