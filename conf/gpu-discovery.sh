#!/usr/bin/env bash
# Fake GPU discovery for tests on machines without GPUs. In local-cluster mode every Worker
# runs this inside the driver's JVM; each call claims the next free number under a directory
# private to that JVM, so the Workers report distinct "GPUs" and the tests can check that each
# task's assignment reaches its rank. Directories of JVMs that are gone are removed.
root="${TMPDIR:-/tmp}"
for old in "$root"/sparktrain-fake-gpus.*; do
    [ -d "$old" ] || continue
    kill -0 "${old##*.}" 2>/dev/null || rm -rf "$old"
done
dir="$root/sparktrain-fake-gpus.$PPID"
mkdir -p "$dir"
n=0
until mkdir "$dir/$n" 2>/dev/null; do n=$((n + 1)); done
echo "{\"name\": \"gpu\", \"addresses\": [\"$n\"]}"
