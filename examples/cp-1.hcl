# Server 1 of a three-server cluster on one machine (127.0.0.1-3 are all loopback on Linux).
name      = "cp-1"
data_dir  = "/tmp/skiff/cp-1"
bind_addr = "127.0.0.1"
log_level = "info"

ports {
  api    = 6443
  raft   = 6444
  gossip = 7946
}

server {
  enabled          = true
  bootstrap_expect = 3
  # The cluster token, the same on every server (make your own: openssl rand -hex 16).
  token            = "example-cluster-token-change-me"
  retry_join       = ["127.0.0.1:7946", "127.0.0.2:7946", "127.0.0.3:7946"]
}
