package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/server"
)

// runDev runs a single-server cluster on loopback: bootstrap_expect 1, a temporary data dir unless one is
// given (removed at exit), and the admin kubeconfig's path printed for the operator commands.
func runDev(args []string) int {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory to keep state in (default: a temporary directory, removed at exit)")
	apiPort := fs.Int("api-port", 6443, "API port")
	logLevel := fs.String("log-level", "info", "log level")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	dir := *dataDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "skiff-dev-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	flags := &config.ServerFile{
		Name: ptr("dev"), DataDir: &dir, BindAddr: ptr("127.0.0.1"), LogLevel: logLevel,
		Ports:  &config.PortsBlock{API: apiPort, Raft: ptr(*apiPort + 1), Gossip: ptr(*apiPort + 2)},
		Server: &config.ServerBlock{BootstrapExpect: ptr(1)},
	}
	cfg, err := config.LoadServer("", flags)
	if err != nil {
		fmt.Fprintf(os.Stderr, "skiff dev: %v\n", err)
		return 1
	}
	logger := newLogger(cfg.LogLevel, false)
	srv, err := server.New(cfg, logger, server.Options{LocalGossip: true})
	if err != nil {
		logger.Error("starting dev server", "error", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "\nSkiff dev cluster starting. Once ready:\n  export KUBECONFIG=%s\n  skiff operator raft list-peers\n\n", srv.KubeconfigPath())
	return waitForShutdown(srv, logger)
}

func ptr[T any](v T) *T { return &v }
