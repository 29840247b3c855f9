package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/localcluster"
)

// runLocal is `skiff local up|down|status`: an HA cluster of network-namespace hosts on this machine.
func runLocal(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: skiff local up|down|status [--dir .skiff] [--servers 3 --agents 2 --runtime containerd --images DIR]\n"+
			"       skiff local kill|start|partition|heal [--dir .skiff] HOST...")
		return 2
	}
	fs := flag.NewFlagSet("local "+args[0], flag.ContinueOnError)
	dir := fs.String("dir", ".skiff", "directory of the local cluster's state, configs, data and logs")
	servers := fs.Int("servers", 3, "servers (up)")
	agents := fs.Int("agents", 2, "node agents (up)")
	runtime := fs.String("runtime", "containerd", "the agents' runtime: containerd or simulated (up)")
	imageDir := fs.String("images", "", "a directory of image tarballs (*.tar) every agent imports at start, to run offline, and the cluster's registry serves (up)")
	listen := fs.String("listen", "", "the address the cluster's registry listens on (registry: started by up)")
	ready := fs.String("ready", "", "the file the registry writes once it holds every image (registry)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	switch args[0] {
	case "up":
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st, err := localcluster.Up(ctx, localcluster.Options{Dir: *dir, Servers: *servers, Agents: *agents, AgentRuntime: *runtime, Images: *imageDir})
		if err != nil {
			fmt.Fprintf(os.Stderr, "skiff local up: %v\n", err)
			return 1
		}
		kubeconfig := st.Kubeconfig(mustAbs(*dir))
		if err := waitForNodes(ctx, kubeconfig, *agents); err != nil {
			fmt.Fprintf(os.Stderr, "skiff local up: the cluster did not come up: %v (logs in %s)\n", err, *dir)
			return 1
		}
		if err := st.WriteClusterKubeconfig(ctx, mustAbs(*dir)); err != nil {
			fmt.Fprintf(os.Stderr, "skiff local up: writing the kubeconfig: %v\n", err)
			return 1
		}
		printLocal(st)
		fmt.Printf("\nexport KUBECONFIG=%s\nkubectl get nodes\n# every server has a context: kubectl --context server-2 get nodes\n",
			localcluster.ClusterKubeconfig(mustAbs(*dir)))
		return 0
	case "status":
		st, err := localcluster.Load(*dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		printLocal(st)
		printClusterStatus(st, mustAbs(*dir))
		return 0
	case "down":
		if err := localcluster.Down(*dir); err != nil {
			fmt.Fprintf(os.Stderr, "skiff local down: %v\n", err)
			return 1
		}
		return 0
	case "kill", "start", "partition", "heal":
		return localHostAction(args[0], mustAbs(*dir), fs.Args())
	case "registry":
		// The cluster's registry host, which `up` starts in its namespace (localcluster/registry.go).
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		if err := localcluster.ServeRegistry(ctx, *imageDir, *listen, *ready); err != nil {
			fmt.Fprintf(os.Stderr, "skiff local registry: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "skiff local: unknown subcommand %q\n", args[0])
	return 2
}

func mustAbs(dir string) string {
	abs, err := os.Getwd()
	if err != nil || strings.HasPrefix(dir, "/") {
		return dir
	}
	return abs + "/" + dir
}

func printLocal(st *localcluster.State) {
	var rows [][]string
	for _, h := range st.Hosts {
		state := "running"
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", h.PID)); err != nil {
			state = "stopped"
		}
		rows = append(rows, []string{h.Name, h.Role, h.IP, h.Netns, state, h.Log})
	}
	table("HOST\tROLE\tIP\tNETNS\tPROCESS\tLOG", rows)
}

// waitForNodes waits until the API answers through the first server and the agents' Nodes are Ready.
func waitForNodes(ctx context.Context, kubeconfig string, agents int) error {
	var last error
	for {
		if cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig); err == nil {
			client := kubernetes.NewForConfigOrDie(cfg)
			nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err == nil {
				ready := 0
				for _, n := range nodes.Items {
					for _, c := range n.Status.Conditions {
						if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
							ready++
						}
					}
				}
				if ready >= agents {
					return nil
				}
				err = fmt.Errorf("%d of %d nodes Ready", ready, agents)
			}
			last = err
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), last)
		case <-time.After(time.Second):
		}
	}
}

// localHostAction is `skiff local kill|start|partition|heal HOST...`: kill -9 a host's process, start it
// again, cut a host off from every other host of the cluster (DROP rules in its namespace, both ways), or
// remove those rules.
func localHostAction(action, dir string, hosts []string) int {
	if len(hosts) == 0 {
		fmt.Fprintf(os.Stderr, "skiff local %s: name at least one host (see skiff local status)\n", action)
		return 2
	}
	st, err := localcluster.Load(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for _, name := range hosts {
		var others []string
		for _, h := range st.Hosts {
			if h.Name != name {
				others = append(others, h.IP)
			}
		}
		switch action {
		case "kill":
			err = st.Kill(name)
		case "start":
			err = st.Start(dir, name)
		case "partition":
			err = st.Partition(name, others)
		case "heal":
			err = st.Heal(name, others)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "skiff local %s %s: %v\n", action, name, err)
			return 1
		}
	}
	return 0
}

// printClusterStatus prints the Raft leader (the kube-system/skiff-leader Lease) and each Node's readiness,
// asking the servers in turn until one answers.
func printClusterStatus(st *localcluster.State, dir string) {
	var last error
	for _, h := range st.Hosts {
		if h.Role != "server" {
			continue
		}
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: localcluster.ClusterKubeconfig(dir)},
			&clientcmd.ConfigOverrides{CurrentContext: h.Name}).ClientConfig()
		if err != nil {
			last = err
			continue
		}
		cfg.Timeout = 3 * time.Second
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			last = err
			continue
		}
		ctx := context.Background()
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			last = err
			continue
		}
		leader := "none"
		if lease, err := client.CoordinationV1().Leases("kube-system").Get(ctx, "skiff-leader", metav1.GetOptions{}); err == nil && lease.Spec.HolderIdentity != nil {
			leader = *lease.Spec.HolderIdentity
		}
		fmt.Printf("\nleader: %s (asked %s)\n", leader, h.Name)
		var rows [][]string
		for _, n := range nodes.Items {
			ready := "Unknown"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready = string(c.Status)
				}
			}
			rows = append(rows, []string{n.Name, ready})
		}
		table("NODE\tREADY", rows)
		return
	}
	fmt.Printf("\nno server answered: %v\n", last)
}
