#!/bin/bash
# run1.sh with part 3 of deferred_pages.cu only (two threads), old's vmm/ from HEAD, and no
# closing native run.
PROBE_ENV=TWO_THREADS_ONLY=1 PROBE_LOG=two_threads.txt PROBE_LIMIT=60 OLD_REV=HEAD CLOSING_NATIVE=0 \
  exec bash "$(dirname "$0")/run1.sh"
