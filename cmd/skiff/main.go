// Command skiff is Skiff's single binary: control-plane server, node agent, dev mode and operator commands.
package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/skiff-dev/skiff/internal/version"
	"github.com/skiff-dev/skiff/nodeagent/containerio"
	"github.com/skiff-dev/skiff/nodeagent/dns"
)

type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{
	"server":   {"run a control-plane peer from an HCL config", runServer},
	"agent":    {"run a node agent from an HCL config", runAgent},
	"dev":      {"run a single-server cluster in one process", runDev},
	"local":    {"run an HA cluster of network-namespace hosts on this machine (up, down, status)", runLocal},
	"operator": {"manage Raft peers, snapshots and gossip members", runOperator},
	"version":  {"print the version", func([]string) int { fmt.Println("skiff", version.Version); return 0 }},
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: skiff <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", name, commands[name].summary)
	}
}

func main() {
	// The node's DNS process is this binary started by an agent (nodeagent/dns): it has no command line.
	dns.RunChildIfAsked()
	// So is a container's stdio process, started for each container (nodeagent/containerio).
	containerio.RunChildIfAsked()
	if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "skiff: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	os.Exit(cmd.run(os.Args[2:]))
}
