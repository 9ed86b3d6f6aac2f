#!/bin/sh
# vclmgr test guest, run once by busybox init: apply the cloud-init NoCloud seed found on the
# CD-ROM labelled "cidata", then start the QEMU guest agent, SSH (dropbear) and DHCP. SSH
# sessions with a terminal are recorded in /run/utmp (the agent's guest-get-users).
#
# Only the cloud-config vclmgr emits is understood (drivers/cloudinit.py):
#   meta-data       instance-id, local-hostname
#   user-data       #cloud-config, block-style YAML: hostname; users: a list of mappings with
#                   name, passwd (crypt hash), lock_passwd, shell, ssh_authorized_keys (a list);
#                   ssh_pwauth; bootcmd: a list of shell commands, run as root before the
#                   services start (an image's own user-data may add them; the test suite's
#                   guest that never answers removes dropbear this way). Other keys and
#                   "- default" user entries are ignored.
#   network-config  version 2; DHCPv4 on every ethernet interface (anything else: DHCP too).
# Values never pass through eval (bootcmd apart, which is meant to run): awk writes each one
# to its own file, the shell reads them.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
say() { echo "vclmgr-guest: $*"; }

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
# The kernel makes its boot id on first read: read it now, as systemd does, so that it names
# this boot (a VM resumed from a snapshot taken later keeps it; a new boot gets another).
cat /proc/sys/kernel/random/boot_id > /run/boot-id
ip link set lo up
while read -r ko; do insmod "/lib/modules/$ko"; done < /lib/modules/load.list

# qemu-ga first: it needs nothing from the seed, and the host's first sign of life is its answer.
agent() {
  for _ in $(seq 100); do
    for p in /sys/class/virtio-ports/*; do
      if [ "$(cat "$p/name" 2>/dev/null)" = org.qemu.guest_agent.0 ]; then
        mkdir -p /dev/virtio-ports /run/qemu-ga
        ln -sf "../${p##*/}" /dev/virtio-ports/org.qemu.guest_agent.0
        qemu-ga -d -m virtio-serial -p "/dev/${p##*/}" -t /run/qemu-ga -f /run/qemu-ga.pid && say "guest agent started"
        return
      fi
    done
    sleep 0.1
  done
  say "no guest agent port"
}
agent &

# The seed: an ISO 9660 volume labelled cidata (retried while the CD-ROM driver probes).
seed=
for _ in $(seq 100); do
  dev=$(findfs LABEL=cidata 2>/dev/null) && mount -t iso9660 -o ro "$dev" /mnt/cidata && seed=/mnt/cidata && break
  sleep 0.1
done
[ -n "$seed" ] || say "no cidata seed found"

S=/run/seed
mkdir -p $S/users
if [ -n "$seed" ]; then
  awk -v out=$S '
    function unq(v) {
      sub(/^[ \t]+/, "", v); sub(/[ \t]+$/, "", v)
      if (v ~ /^'"'"'.*'"'"'$/) { v = substr(v, 2, length(v) - 2); gsub(/'"'"''"'"'/, "'"'"'", v) }
      else if (v ~ /^".*"$/) { v = substr(v, 2, length(v) - 2); gsub(/\\"/, "\"", v); gsub(/\\\\/, "\\", v) }
      return v
    }
    function put(file, v) { print v > file; close(file) }
    FILENAME ~ /meta-data$/ {
      if ($0 ~ /^local-hostname:/) { sub(/^local-hostname:/, ""); put(out "/meta-hostname", unq($0)) }
      next
    }
    /^#/ || /^[ \t]*$/ { next }
    /^[^ -]/ {                                    # a top-level key
      key = $0; sub(/:.*/, "", key); val = $0; sub(/^[^:]*:/, "", val)
      section = key; item = ""; list = ""
      if (key == "hostname") put(out "/hostname", unq(val))
      if (key == "ssh_pwauth") put(out "/ssh_pwauth", unq(val))
      next
    }
    section == "bootcmd" && /^[ \t]*- / { v = $0; sub(/^[ \t]*- /, "", v); print unq(v) >> (out "/bootcmd"); close(out "/bootcmd"); next }
    section != "users" { next }
    {
      line = $0; match(line, /^ */); ind = RLENGTH; line = substr(line, ind + 1)
      if (itemind == "" && line ~ /^- /) itemind = ind
      if (ind == itemind && line ~ /^- /) {          # a new list item
        n++; item = out "/users/" n; list = ""; line = substr(line, 3)
        if (line !~ /^[a-z_]+:/) { item = ""; next } # "- default" and other non-mappings
        system("mkdir -p " item); ind = ind + 2
      }
      if (item == "") next
      if (list != "" && ind >= keyind && line ~ /^- /) { v = unq(substr(line, 3)); print v >> (item "/" list); close(item "/" list); next }
      if (line ~ /^[a-z_]+:/) {
        k = line; sub(/:.*/, "", k); v = line; sub(/^[^:]*:/, "", v); keyind = ind
        if (unq(v) == "") { list = k; printf "" > (item "/" k); close(item "/" k) }
        else { list = ""; put(item "/" k, unq(v)) }
      }
    }' "$seed/meta-data" "$seed/user-data"
fi

valid_host() { case "$1" in ""|*[!A-Za-z0-9.-]*) return 1 ;; esac; }
host=$(cat $S/hostname 2>/dev/null); valid_host "$host" || host=$(cat $S/meta-hostname 2>/dev/null)
valid_host "$host" || host=localhost
hostname "$host"; echo "$host" > /etc/hostname; echo "127.0.1.1 $host" >> /etc/hosts

uid=1000
members=
for u in $S/users/*; do
  [ -f "$u/name" ] || continue
  name=$(cat "$u/name")
  case "$name" in ""|root|*[!a-z0-9_.-]*) say "user name refused: $name"; continue ;; esac
  grep -q "^$name:" /etc/passwd && continue
  shell=$(cat "$u/shell" 2>/dev/null)
  case "$shell" in *:*) shell= ;; esac
  [ -x "$shell" ] || shell=/bin/sh  # e.g. /bin/bash: busybox has only sh
  hash='!'
  if [ -f "$u/passwd" ]; then
    hash=$(cat "$u/passwd")
    case "$hash" in ""|*:*) hash='!' ;; esac  # a ':' would break /etc/shadow
    # cloud-init's default is lock_passwd: true, which disables the password.
    [ "$(cat "$u/lock_passwd" 2>/dev/null)" = false ] || hash="!$hash"
  fi
  home=/home/$name
  echo "$name:x:$uid:$uid::$home:$shell" >> /etc/passwd
  echo "$name:x:$uid:" >> /etc/group
  members="$members${members:+,}$name"
  echo "$name:$hash:19000:0:99999:7:::" >> /etc/shadow
  mkdir -p "$home/.ssh"
  [ -f "$u/ssh_authorized_keys" ] && cp "$u/ssh_authorized_keys" "$home/.ssh/authorized_keys"
  chmod 700 "$home" "$home/.ssh"
  chown -R "$uid:$uid" "$home"
  say "user $name ($(grep -c . "$home/.ssh/authorized_keys" 2>/dev/null || echo 0) keys)"
  uid=$((uid + 1))
done

# The root filesystem is this RAM disk, so nothing a user does survives a reboot except what
# is written to the disk itself: the users may write it raw (group disk), so a test can leave a
# mark there that only a revert of the VM's disk removes.
echo "disk:x:6:$members" >> /etc/group
[ -b /dev/vda ] && chgrp 6 /dev/vda && chmod 660 /dev/vda

if [ -f $S/bootcmd ]; then
  while read -r cmd; do say "bootcmd: $cmd"; sh -c "$cmd" </dev/null; done < $S/bootcmd
fi

# Logins go to utmp (glibc's login(), called by dropbear for a session with a terminal), which
# the guest agent's guest-get-users reads: how vclmgr's idle reclamation sees who is connected.
# glibc never creates the file itself.
: > /run/utmp
chmod 644 /run/utmp
dropbearkey -t ed25519 -f /etc/dropbear/dropbear_ed25519_host_key 2>/dev/null | grep -i fingerprint
pw=-s
[ "$(cat $S/ssh_pwauth 2>/dev/null)" = true ] && pw=
dropbear -r /etc/dropbear/dropbear_ed25519_host_key -p 22 -P /run/dropbear.pid $pw && say "ssh started"

# Every NIC at once: one whose network is slow to answer (or never does) must not hold back
# the others, among them the one the host reaches SSH through.
for i in /sys/class/net/*; do
  i=${i##*/}
  [ "$i" = lo ] && continue
  udhcpc -i "$i" -s /etc/udhcpc.sh -b -t 30 -T 1 -A 1 -x "hostname:$host" >/dev/null 2>&1 &
done
wait
say "ready"
