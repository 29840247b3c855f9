// Package localcluster runs a multi-host Skiff cluster on one machine: each host is a network namespace with
// its own address, routes and iptables, joined to the others by a veth pair on a shared bridge, and runs one
// `skiff server` or `skiff agent` from a generated HCL file. `skiff local up|down|status` drives it; the
// end-to-end tests use it to kill, partition and heal hosts for real.
package localcluster

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/internal/images"
)

// Options say what to bring up.
type Options struct {
	Dir     string // state, configs, data and logs; created
	Servers int
	Agents  int
	Binary  string // the skiff binary; the running one when empty
	// AgentRuntime is the agents' runtime: containerd (default) or simulated.
	AgentRuntime string
	// Images is a directory of image tarballs (*.tar, OCI or docker-archive) copied into every agent's
	// <data_dir>/images/, which the agent imports at start: the cluster then runs them with no registry.
	Images string
}

// imageTarballs lists the *.tar files in dir, and fails when there is none: an --images without images is
// surely a mistake.
func imageTarballs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("--images: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".tar") {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--images: no image tarball (*.tar) in %s", dir)
	}
	return out, nil
}

// copyFile copies src to dst, which it creates.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// Host is one namespace of the cluster.
type Host struct {
	Name   string `json:"name"`
	Role   string `json:"role"` // server or agent
	Netns  string `json:"netns"`
	IP     string `json:"ip"`
	Veth   string `json:"veth"` // the host side, on the bridge
	Config string `json:"config"`
	Log    string `json:"log"`
	PID    int    `json:"pid"`
	// Images is the directory of image tarballs the registry host serves (registry.go).
	Images string `json:"images,omitempty"`
}

// State is what `up` made, saved in <dir>/state.json for `down` and `status`.
type State struct {
	ID      string `json:"id"`
	Bridge  string `json:"bridge"`
	Gateway string `json:"gateway"` // the host's address on the bridge
	Binary  string `json:"binary"`
	Token   string `json:"token"`
	// GossipKey encrypts the gossip pool (every HCL's `encrypt`), as a production cluster should.
	GossipKey string `json:"gossip_key"`
	// PodCIDR is the servers' cluster_cidr: a /16 no other cluster on the machine routes (freePodCIDR).
	PodCIDR string `json:"pod_cidr,omitempty"`
	Hosts   []Host `json:"hosts"`
}

// ClusterKubeconfig is <dir>/kubeconfig, written by WriteClusterKubeconfig.
func ClusterKubeconfig(dir string) string { return filepath.Join(dir, "kubeconfig") }

// WriteClusterKubeconfig writes ClusterKubeconfig: one context per server, named after its host, with the
// admin credentials each server wrote into its data dir; the first server's is current. It waits (until ctx
// ends) for a server that has not written its admin kubeconfig yet.
func (s *State) WriteClusterKubeconfig(ctx context.Context, dir string) error {
	merged := clientcmdapi.NewConfig()
	for _, h := range s.Hosts {
		if h.Role != "server" {
			continue
		}
		path := filepath.Join(dir, h.Name, "data", "admin.kubeconfig")
		var cfg *clientcmdapi.Config
		for {
			var err error
			if cfg, err = clientcmd.LoadFromFile(path); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %w (%v)", path, ctx.Err(), err)
			case <-time.After(200 * time.Millisecond):
			}
		}
		current, ok := cfg.Contexts[cfg.CurrentContext]
		if !ok || cfg.Clusters[current.Cluster] == nil || cfg.AuthInfos[current.AuthInfo] == nil {
			return fmt.Errorf("%s has no usable current context", path)
		}
		merged.Clusters[h.Name] = cfg.Clusters[current.Cluster]
		merged.AuthInfos[h.Name] = cfg.AuthInfos[current.AuthInfo]
		merged.Contexts[h.Name] = &clientcmdapi.Context{Cluster: h.Name, AuthInfo: h.Name}
		if merged.CurrentContext == "" {
			merged.CurrentContext = h.Name
		}
	}
	return clientcmd.WriteToFile(*merged, ClusterKubeconfig(dir))
}

// Kubeconfig is the admin kubeconfig of the first server.
func (s *State) Kubeconfig(dir string) string {
	return filepath.Join(dir, s.Hosts[0].Name, "data", "admin.kubeconfig")
}

// Host returns a host by name.
func (s *State) Host(name string) (*Host, bool) {
	for i := range s.Hosts {
		if s.Hosts[i].Name == name {
			return &s.Hosts[i], true
		}
	}
	return nil, false
}

func stateFile(dir string) string { return filepath.Join(dir, "state.json") }

// Load reads the state `up` saved.
func Load(dir string) (*State, error) {
	data, err := os.ReadFile(stateFile(dir))
	if err != nil {
		return nil, fmt.Errorf("no local cluster in %s: %w", dir, err)
	}
	var s State
	return &s, json.Unmarshal(data, &s)
}

func (s *State) save(dir string) error {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(stateFile(dir), data, 0o600)
}

func run(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// deleteLink removes a network link; one already gone is not an error. The kernel may free a veth whose
// namespace just went away between ip's lookup ("Cannot find device") and its delete ("No such device").
func deleteLink(name string) error {
	err := run("ip", "link", "del", name)
	if err != nil && (strings.Contains(err.Error(), "Cannot find device") || strings.Contains(err.Error(), "No such device")) {
		return nil
	}
	return err
}

// inNetns is the command line that runs args in the host's network namespace and nothing else: unlike
// `ip netns exec`, nsenter keeps the mount namespace, so /sys/fs/cgroup stays visible to containerd and runc.
func (h *Host) inNetns(args ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + h.Netns, "--"}, args...)
}

// InNetns runs a command in a host's network namespace, for tests and operators (partitions, say).
func (h *Host) InNetns(args ...string) error {
	return run(h.inNetns(args...)...)
}

// Up makes the network and starts the processes, agents first (they keep trying to join until a server
// answers), and returns once every process runs; the caller waits for the API.
//  1. a bridge with a free 10.x.y.0/24, the host's side at .1;
//  2. per host: a namespace, a veth pair onto the bridge, its address (.10 and up), lo, a default route;
//  3. per host: its HCL (servers: bootstrap_expect and retry_join of all servers; agents: retry_join of the
//     first server only, so the rest is learned by gossip) and its process, inside the namespace.
func Up(ctx context.Context, opts Options) (*State, error) {
	if opts.Servers < 1 {
		return nil, errors.New("at least one server is needed")
	}
	var tarballs []string
	if opts.Images != "" {
		var err error
		if tarballs, err = imageTarballs(opts.Images); err != nil {
			return nil, err
		}
	}
	if opts.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		opts.Binary = exe
	}
	if opts.AgentRuntime == "" {
		opts.AgentRuntime = "containerd"
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(stateFile(dir)); err == nil {
		return nil, fmt.Errorf("%s already holds a local cluster; run `skiff local down --dir %s` first", dir, opts.Dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	idBytes := make([]byte, 3)
	_, _ = rand.Read(idBytes)
	tokenBytes := make([]byte, 16)
	_, _ = rand.Read(tokenBytes)
	gossipKey := make([]byte, 32)
	_, _ = rand.Read(gossipKey)
	st := &State{ID: hex.EncodeToString(idBytes), Binary: opts.Binary, Token: hex.EncodeToString(tokenBytes),
		GossipKey: base64.StdEncoding.EncodeToString(gossipKey)}
	st.Bridge = "skl" + st.ID
	prefix, err := freeSubnet()
	if err != nil {
		return nil, err
	}
	st.Gateway = prefix + ".1"
	if st.PodCIDR, err = freePodCIDR(); err != nil {
		return nil, err
	}
	if err := st.save(dir); err != nil { // from here on, `down` can undo whatever was made
		return nil, err
	}
	fail := func(err error) (*State, error) {
		_ = Down(dir)
		return nil, err
	}
	for _, cmd := range [][]string{
		{"ip", "link", "add", st.Bridge, "type", "bridge"},
		{"ip", "addr", "add", st.Gateway + "/24", "dev", st.Bridge},
		{"ip", "link", "set", st.Bridge, "up"},
	} {
		if err := run(cmd...); err != nil {
			return fail(err)
		}
	}
	var mirrored []string
	withRegistry := len(tarballs) > 0 && opts.AgentRuntime == "containerd"
	if withRegistry {
		if mirrored, err = mirroredRegistries(tarballs); err != nil {
			return fail(err)
		}
	}
	var serverIPs []string
	hosts := opts.Servers + opts.Agents
	if withRegistry {
		hosts++
	}
	for i := 0; i < hosts; i++ {
		h := Host{Role: "server", Name: fmt.Sprintf("server-%d", i+1)}
		switch {
		case i >= opts.Servers+opts.Agents:
			h.Role, h.Name = "registry", "registry"
			if h.Images, err = filepath.Abs(opts.Images); err != nil {
				return fail(err)
			}
		case i >= opts.Servers:
			h.Role, h.Name = "agent", fmt.Sprintf("agent-%d", i-opts.Servers+1)
		}
		h.Netns = fmt.Sprintf("skl-%s-%s", st.ID, h.Name)
		h.IP = fmt.Sprintf("%s.%d", prefix, 10+i)
		h.Veth = fmt.Sprintf("skl%s%d", st.ID, i)
		h.Log = filepath.Join(dir, h.Name+".log")
		h.Config = filepath.Join(dir, h.Name+".hcl")
		if h.Role == "server" {
			serverIPs = append(serverIPs, h.IP)
		}
		st.Hosts = append(st.Hosts, h)
		if err := st.save(dir); err != nil {
			return fail(err)
		}
		if err := makeHost(st, &h); err != nil {
			return fail(fmt.Errorf("host %s: %w", h.Name, err))
		}
	}
	for i := range st.Hosts {
		h := &st.Hosts[i]
		if h.Role == "registry" {
			continue
		}
		if err := os.WriteFile(h.Config, []byte(hostHCL(st, h, dir, serverIPs, mirrored, opts)), 0o600); err != nil {
			return fail(err)
		}
		if h.Role == "agent" && opts.AgentRuntime == "containerd" {
			// No registry may be reachable: each agent imports this busybox at start.
			imageDir := filepath.Join(dir, h.Name, "data", "images")
			if err := images.WriteOfflineBusybox(filepath.Join(imageDir, "busybox.tar")); err != nil {
				return fail(err)
			}
			for _, src := range tarballs {
				if err := copyFile(src, filepath.Join(imageDir, "user-"+filepath.Base(src))); err != nil {
					return fail(fmt.Errorf("copying %s to %s: %w", src, h.Name, err))
				}
			}
		}
	}
	// The registry first, so that the agents find every image in it; then agents: they must find the
	// servers by retrying, whatever the order.
	for i := range st.Hosts {
		if h := &st.Hosts[i]; h.Role == "registry" {
			if err := startRegistry(ctx, st, h, dir); err != nil {
				return fail(err)
			}
		}
	}
	for _, role := range []string{"agent", "server"} {
		for i := range st.Hosts {
			if h := &st.Hosts[i]; h.Role == role {
				if err := start(st, h); err != nil {
					return fail(fmt.Errorf("starting %s: %w", h.Name, err))
				}
			}
		}
	}
	if err := st.save(dir); err != nil {
		return fail(err)
	}
	return st, nil
}

// freeSubnet picks a 10.x.y.0/24 that no interface on this machine uses.
func freeSubnet() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for tries := 0; tries < 100; tries++ {
		n, _ := rand.Int(rand.Reader, big.NewInt(250))
		prefix := fmt.Sprintf("10.%d.%d", 200+n.Int64()%50, n.Int64())
		_, subnet, _ := net.ParseCIDR(prefix + ".0/24")
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && subnet.Contains(ipn.IP) {
				used = true
			}
		}
		if !used {
			return prefix, nil
		}
	}
	return "", errors.New("no free 10.x.y.0/24 for the local cluster")
}

// LoadBalancerPool is the servers' default load balancer pool: the top of the cluster's /24 (.200 to .250),
// above the hosts' addresses (.10 up) and below the broadcast address.
func LoadBalancerPool(st *State) string {
	prefix := strings.TrimSuffix(st.Gateway, ".1")
	return prefix + ".200-" + prefix + ".250"
}

// freePodCIDR picks a 10.x.0.0/16 (x from 100 to 199) for the cluster's pods that overlaps no route of this
// machine's, in its own network namespace or in any named one: the hosts of other local clusters route their
// pod CIDRs there, and a `skiff dev` or an agent on the machine itself here. Two clusters on one machine then
// never share pod addresses, and the machine can route to each cluster's pods.
func freePodCIDR() (string, error) {
	var used []*net.IPNet
	add := func(args ...string) error {
		out, err := exec.Command("ip", append(args, "-j", "route", "show", "table", "all")...).Output()
		if err != nil {
			return fmt.Errorf("ip %s route show: %w", strings.Join(args, " "), err)
		}
		var routes []struct {
			Dst string `json:"dst"`
		}
		if err := json.Unmarshal(out, &routes); err != nil {
			return fmt.Errorf("ip %s route show: %w", strings.Join(args, " "), err)
		}
		for _, r := range routes {
			if !strings.Contains(r.Dst, "/") {
				r.Dst += "/32" // a host route; "default" fails to parse and is skipped
			}
			if _, n, err := net.ParseCIDR(r.Dst); err == nil && n.IP.To4() != nil {
				if ones, _ := n.Mask.Size(); ones > 0 {
					used = append(used, n)
				}
			}
		}
		return nil
	}
	if err := add(); err != nil {
		return "", err
	}
	namespaces, _ := os.ReadDir("/run/netns")
	for _, ns := range namespaces {
		_ = add("-n", ns.Name()) // one going away meanwhile is no matter
	}
	start, _ := rand.Int(rand.Reader, big.NewInt(100))
	for i := int64(0); i < 100; i++ {
		cidr := fmt.Sprintf("10.%d.0.0/16", 100+(start.Int64()+i)%100)
		_, candidate, _ := net.ParseCIDR(cidr)
		free := true
		for _, n := range used {
			if n.Contains(candidate.IP) || candidate.Contains(n.IP) {
				free = false
				break
			}
		}
		if free {
			return cidr, nil
		}
	}
	return "", errors.New("no free 10.x.0.0/16 (x from 100 to 199) for the local cluster's pods")
}

// makeHost creates the host's namespace and wires it to the bridge.
func makeHost(st *State, h *Host) error {
	peer := "p" + h.Veth[1:]
	for _, cmd := range [][]string{
		{"ip", "netns", "add", h.Netns},
		{"ip", "link", "add", h.Veth, "type", "veth", "peer", "name", peer},
		{"ip", "link", "set", peer, "netns", h.Netns},
		{"ip", "link", "set", h.Veth, "master", st.Bridge},
		{"ip", "link", "set", h.Veth, "up"},
		{"ip", "netns", "exec", h.Netns, "ip", "link", "set", peer, "name", "eth0"},
		{"ip", "netns", "exec", h.Netns, "ip", "addr", "add", h.IP + "/24", "dev", "eth0"},
		{"ip", "netns", "exec", h.Netns, "ip", "link", "set", "eth0", "up"},
		{"ip", "netns", "exec", h.Netns, "ip", "link", "set", "lo", "up"},
		{"ip", "netns", "exec", h.Netns, "ip", "route", "add", "default", "via", st.Gateway},
		// Agents route pod traffic between their bridge and eth0.
		{"ip", "netns", "exec", h.Netns, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
	} {
		if err := run(cmd...); err != nil {
			return err
		}
	}
	return nil
}

// hostHCL is a host's configuration file.
func hostHCL(st *State, h *Host, dir string, serverIPs, mirrored []string, opts Options) string {
	quoted := func(ips []string) string {
		var q []string
		for _, ip := range ips {
			q = append(q, fmt.Sprintf("%q", ip))
		}
		return strings.Join(q, ", ")
	}
	dataDir := filepath.Join(dir, h.Name, "data")
	clusterCIDR := ""
	if st.PodCIDR != "" {
		clusterCIDR = fmt.Sprintf("\n  # Pods' addresses: a range no other cluster on this machine uses.\n  cluster_cidr     = %q", st.PodCIDR)
	}
	if h.Role == "server" {
		return fmt.Sprintf(`# skiff local: server %s in network namespace %s
name      = %q
data_dir  = %q
bind_addr = %q
encrypt   = %q
server {
  bootstrap_expect = %d
  retry_join       = [%s]
  retry_interval   = "500ms"
  token            = %q
  # The servers reach pods (webhooks, extension API servers) through each node's pod CIDR route.
  route_pod_cidrs  = true%s
  # LoadBalancer Services get addresses on the cluster's network, which this machine is on: one agent
  # answers for each, and another takes it over when that one dies.
  load_balancer {
    pool = [%q]
  }
}
`, h.Name, h.Netns, h.Name, dataDir, h.IP, st.GossipKey, len(serverIPs), quoted(serverIPs), st.Token, clusterCIDR, LoadBalancerPool(st))
	}
	return fmt.Sprintf(`# skiff local: agent %s in network namespace %s
name      = %q
data_dir  = %q
bind_addr = %q
encrypt   = %q
agent {
  retry_join     = [%s]
  retry_interval = "1s"
  token          = %q
  runtime        = %q%s
}
`, h.Name, h.Netns, h.Name, dataDir, h.IP, st.GossipKey, quoted(serverIPs[:1]), st.Token, opts.AgentRuntime, registryBlocks(st, mirrored))
}

// registryBlocks are an agent's `registry` blocks: the cluster's registry first for each registry its images
// are named after, then that registry itself.
func registryBlocks(st *State, mirrored []string) string {
	reg, ok := st.Host("registry")
	if !ok {
		return ""
	}
	var b strings.Builder
	for _, host := range mirrored {
		fmt.Fprintf(&b, "\n  # The cluster's registry (--images) serves this registry's images, and the registry itself the rest.\n"+
			"  registry %q {\n    endpoints = [\"http://%s:%d\", %q]\n  }", host, reg.IP, registryPort, host)
	}
	return b.String()
}

// start runs the host's process in its namespace, in a session of its own so it outlives `skiff local up`.
func start(st *State, h *Host) error {
	logFile, err := os.OpenFile(h.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	argv := h.inNetns(st.Binary, h.Role, "-config", h.Config)
	if h.Role == "registry" {
		argv = h.inNetns(st.Binary, "local", "registry", "--images", h.Images, "--listen", fmt.Sprintf("%s:%d", h.IP, registryPort),
			"--ready", RegistryReadyFile(filepath.Dir(h.Log)))
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	h.PID = cmd.Process.Pid
	go func() { _ = cmd.Wait() }() // reaped if it dies while this process lives
	return nil
}

// startRegistry starts the registry host's process and waits until it holds every image.
func startRegistry(ctx context.Context, st *State, h *Host, dir string) error {
	_ = os.Remove(RegistryReadyFile(dir))
	if err := start(st, h); err != nil {
		return fmt.Errorf("starting the registry: %w", err)
	}
	for {
		if _, err := os.Stat(RegistryReadyFile(dir)); err == nil {
			return nil
		}
		if !alive(h.PID) {
			return fmt.Errorf("the registry exited (see %s)", h.Log)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the registry to hold the images: %w (see %s)", ctx.Err(), h.Log)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Start starts a stopped host again (after Kill, say).
func (s *State) Start(dir, name string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	if err := start(s, h); err != nil {
		return err
	}
	return s.save(dir)
}

// Kill stops a host's process with SIGKILL (kill -9).
func (s *State) Kill(name string) error { return s.Signal(name, syscall.SIGKILL, 5*time.Second) }

// Signal sends a host's process sig and waits up to timeout for it to exit.
func (s *State) Signal(name string, sig syscall.Signal, timeout time.Duration) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	return signalAndWait(h.PID, sig, timeout)
}

// Stop stops a host's process with SIGTERM, then SIGKILL after timeout.
func (s *State) Stop(name string, timeout time.Duration) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	if err := signalAndWait(h.PID, syscall.SIGTERM, timeout); err != nil {
		return signalAndWait(h.PID, syscall.SIGKILL, 5*time.Second)
	}
	return nil
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	// A zombie has exited; /proc still lists it until it is reaped.
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func signalAndWait(pid int, sig syscall.Signal, timeout time.Duration) error {
	if !alive(pid) {
		return nil
	}
	_ = syscall.Kill(pid, sig)
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if !alive(pid) {
			return nil
		}
	}
	return fmt.Errorf("process %d still runs %v after %v", pid, timeout, sig)
}

// Partition cuts a host off from the given addresses (both ways), with iptables in the host's namespace.
func (s *State) Partition(name string, from []string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	for _, ip := range from {
		if err := h.InNetns("iptables", "-I", "INPUT", "-s", ip, "-j", "DROP"); err != nil {
			return err
		}
		if err := h.InNetns("iptables", "-I", "OUTPUT", "-d", ip, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// Heal removes a host's partition rules.
func (s *State) Heal(name string, from []string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	var errs []error
	for _, ip := range from {
		errs = append(errs, h.InNetns("iptables", "-D", "INPUT", "-s", ip, "-j", "DROP"),
			h.InNetns("iptables", "-D", "OUTPUT", "-d", ip, "-j", "DROP"))
	}
	return errors.Join(errs...)
}

// Down stops every process, removes the agents' pods (containers, network namespaces, IPs), the namespaces,
// the veths and the bridge, and then the directory. It does whatever it can and reports what failed.
func Down(dir string) error {
	st, err := Load(dir)
	if err != nil {
		return err
	}
	var errs []error
	for i := range st.Hosts {
		h := &st.Hosts[i]
		if err := signalAndWait(h.PID, syscall.SIGTERM, 15*time.Second); err != nil {
			errs = append(errs, signalAndWait(h.PID, syscall.SIGKILL, 5*time.Second))
		}
	}
	// Data dirs the chaos suite moved onto loop filesystems go back before anything is removed.
	errs = append(errs, ReleaseDataDirs(dir))
	for i := range st.Hosts {
		h := &st.Hosts[i]
		// The namespace goes only once the agent's teardown in it has succeeded, so a down cut short before
		// that runs the teardown again; a namespace already gone means the teardown ran.
		_, nsErr := os.Stat(filepath.Join("/run/netns", h.Netns))
		tornDown := true
		if h.Role == "agent" && nsErr == nil {
			if _, err := os.Stat(h.Config); err == nil {
				if err := h.InNetns(st.Binary, "agent", "-config", h.Config, "-teardown"); err != nil {
					errs = append(errs, err)
					tornDown = false
				}
			}
		}
		if err := killNetnsProcesses(h.Netns, 15*time.Second); err != nil {
			errs = append(errs, err)
		}
		if !tornDown {
			continue
		}
		if err := run("ip", "netns", "del", h.Netns); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
		// The namespace may outlive its name for a while (the kernel frees it when the last reference
		// goes); deleting the host end of the veth removes the pair now.
		if err := deleteLink(h.Veth); err != nil {
			errs = append(errs, err)
		}
	}
	if err := deleteLink(st.Bridge); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// killNetnsProcesses kills whatever still runs in a host's network namespace once its skiff process is gone
// (a private containerd and its shims, a process a test started there) and waits until it has exited, so
// that `down` returns only when nothing it started is left. Containers run in their pods' own namespaces;
// the agent's teardown has removed them before this.
func killNetnsProcesses(netns string, timeout time.Duration) error {
	pids := func() []int {
		out, err := exec.Command("ip", "netns", "pids", netns).Output()
		if err != nil {
			return nil // no such namespace: nothing runs in it
		}
		var pids []int
		for _, f := range strings.Fields(string(out)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil && alive(pid) {
				pids = append(pids, pid)
			}
		}
		return pids
	}
	sig := syscall.SIGTERM
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		left := pids()
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if sig == syscall.SIGKILL {
				return fmt.Errorf("processes %v still run in %s", left, netns)
			}
			sig, deadline = syscall.SIGKILL, time.Now().Add(5*time.Second)
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, sig)
		}
	}
}
