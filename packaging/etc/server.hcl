# Skiff server: a control-plane peer, run by skiff-server.service as the skiff user.
# Every key is in /usr/share/doc/skiff/configuration.md.
#
# As shipped this is a cluster of one server on loopback: `systemctl enable --now skiff-server`, then
#   kubectl --kubeconfig /var/lib/skiff/server/admin.kubeconfig get nodes
# For three servers on three machines: bind_addr = this machine's address, bootstrap_expect = 3, the same
# token on each, and retry_join listing the others' gossip addresses (port 7946).

# name    = "cp-1"                   # unique; defaults to the hostname
data_dir  = "/var/lib/skiff/server"
bind_addr = "127.0.0.1"              # every listener (API 6443, Raft 6444, gossip 7946) binds here
log_level = "info"

server {
  bootstrap_expect = 1
  # The cluster token, the same on every server (openssl rand -hex 16). A single server without one draws
  # its own and keeps it in <data_dir>/cluster-token.
  # token          = "..."
  # retry_join     = ["10.0.0.2:7946", "10.0.0.3:7946"]
}
