# Skiff node agent, run by skiff-agent.service as root.
# Every key is in /usr/share/doc/skiff/configuration.md ("skiff agent").
#
# As shipped it joins the server on this machine (/etc/skiff/server.hcl) once the token is set:
#   sed -i "s|^  token .*|  token   = \"$(cat /var/lib/skiff/server/join-token)\"|" /etc/skiff/agent.hcl
#   systemctl enable --now skiff-agent
# On a machine of its own: bind_addr = its address, and servers (API addresses) or retry_join (gossip
# addresses) of the servers.

# name    = "node-1"                 # the Node's name; defaults to the hostname
data_dir  = "/var/lib/skiff/agent"   # keep it short: the private containerd's socket lives under it
bind_addr = "127.0.0.1"

ports {
  gossip = 7947                      # 7946 is the server's on this machine
  agent  = 10250                     # the HTTPS endpoint the servers reach for logs and exec
}

agent {
  servers = ["127.0.0.1:6443"]
  # retry_join = ["10.0.0.1:7946"]
  # A server's <data_dir>/join-token (K10<hash>::<secret>).
  token   = ""
  # Empty: a private containerd under <data_dir>/containerd. Or the system's:
  # containerd_socket = "/run/containerd/containerd.sock"
}
