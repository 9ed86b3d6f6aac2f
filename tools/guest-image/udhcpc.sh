#!/bin/sh
# busybox udhcpc hook: apply the lease to $interface.
#
# /etc/resolv.conf holds the DNS servers and domains of every interface's lease, not only the
# last one's (each interface's are kept in /run/dns/$interface), as a resolver that knows all
# links does: on a private network of an environment its dnsmasq answers the other members'
# names, and a lease on another NIC must not take those away.
resolv() {
  mkdir -p /run/dns
  if [ -n "$1" ]; then
    : > "/run/dns.$interface"
    for d in $dns; do echo "nameserver $d" >> "/run/dns.$interface"; done
    [ -n "$domain" ] && echo "search $domain" >> "/run/dns.$interface"
    mv "/run/dns.$interface" "/run/dns/$interface"
  else
    rm -f "/run/dns/$interface"
  fi
  # Interfaces in name order, each server once; one search line of every domain.
  cat /run/dns/* 2>/dev/null | awk '
    $1 == "nameserver" && !seen[$2]++ { print }
    $1 == "search" { for (i = 2; i <= NF; i++) if (!known[$i]++) domains = domains " " $i }
    END { if (domains != "") print "search" domains }' > "/etc/resolv.conf.$interface"
  mv "/etc/resolv.conf.$interface" /etc/resolv.conf
}

case "$1" in
  deconfig) ip addr flush dev "$interface"; ip link set "$interface" up; resolv ;;
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do ip route replace default via "$r" dev "$interface"; break; done
    resolv lease
    echo "vclmgr-guest: $interface has $ip" > /dev/console ;;
esac
