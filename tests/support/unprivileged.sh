#!/bin/sh
# Runs a command as nobody (uid 65534) with loopback as its only network, over this tree and its venv
# in place: the proof that a test tier needs no root, no runc and no network. Run by a user other
# than root, it just runs the command.
#
# The command runs in mount and network namespaces of its own, so nothing changes outside them. When
# the venv's interpreter lies under a directory nobody may not enter (pyenv under /root), a tmpfs
# hides the rest of that directory there and the interpreter's tree is bound back in.
set -eu
[ "$(id -u)" = 0 ] || exec "$@"

blocked=""
kept=""
directory=""
for part in $(readlink -f .venv/bin/python | tr / ' '); do
    if [ -z "$blocked" ] && ! setpriv --reuid=65534 --regid=65534 --clear-groups test -x "${directory:-/}"; then
        blocked="${directory:-/}"
        kept="$directory/$part"
    fi
    directory="$directory/$part"
done

export blocked kept
exec unshare --mount --net --propagation private sh -eu -c '
    ip link set lo up
    if [ -n "$blocked" ]; then
        hold=$(mktemp -d)
        mount --bind "$kept" "$hold"
        mount -t tmpfs -o mode=0755,size=1m tmpfs "$blocked"
        mkdir -p "$kept"
        mount --bind "$hold" "$kept"
        umount "$hold"
        rmdir "$hold"
    fi
    exec setpriv --reuid=65534 --regid=65534 --clear-groups env HOME=/tmp PYTHONDONTWRITEBYTECODE=1 "$@"
' sh "$@"
