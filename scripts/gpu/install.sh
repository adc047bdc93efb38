#!/usr/bin/env bash
# Device, once every chunk is in /root/w (call.sh): join, check against bundle.txt, unpack into $GPU_STACK.
# bundle.txt holds the stream's sha256 and its number of chunks (build_bundle.sh).
set -euo pipefail
W=${GPU_CHUNKS:-/root/w}
GPU_STACK=${GPU_STACK:-/root/gpu}
read -r sum chunks <"$W/bundle.txt"
have=$(find "$W" -maxdepth 1 -name 'p[0-9]*' | wc -l)
[[ $have == "$chunks" ]] || { echo "install: $have of $chunks chunks in $W: call again with the missing ones"; exit 1; }
start=$SECONDS
echo "$sum  -" >"$W/sum" && cat $(ls "$W"/p[0-9]* | sort -V) | sha256sum -c --quiet "$W/sum"
mkdir -p "$GPU_STACK"
if command -v xz >/dev/null; then
  cat $(ls "$W"/p[0-9]* | sort -V) | xz -dc -T0 | tar -x -C "$GPU_STACK"
else
  cat $(ls "$W"/p[0-9]* | sort -V) | python3 -c "import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1], filter='fully_trusted')" "$GPU_STACK"
fi
rm -f "$W"/p[0-9]*
if [[ -f $W/fa2 ]]; then  # the optional FlashAttention-2 chunk (README.md), into the stack unpacked above
  if command -v xz >/dev/null; then xz -dc "$W/fa2" | tar -x -C "$GPU_STACK/site"; else
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='fully_trusted')" \
      "$W/fa2" "$GPU_STACK/site"
  fi
fi
echo "$sum" >"$GPU_STACK/.installed"  # call.sh installs a bundle once
echo "install: $(du -sh "$GPU_STACK" | cut -f1) in $GPU_STACK in $((SECONDS - start)) s"
