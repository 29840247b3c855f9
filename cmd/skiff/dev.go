package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/images"
	"github.com/skiff-dev/skiff/nodeagent"
	"github.com/skiff-dev/skiff/server"
)

// runDev runs a single-server cluster on loopback: bootstrap_expect 1, a temporary data dir unless one is
// given (removed at exit), and the admin kubeconfig's path printed for the operator commands.
func runDev(args []string) int {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory to keep state in (default: a temporary directory, removed at exit)")
	apiPort := fs.Int("api-port", 6443, "API port")
	logLevel := fs.String("log-level", "info", "log level")
	runtime := fs.String("runtime", config.RuntimeContainerd, "the dev node's runtime: containerd, simulated, or none (no node agent)")
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
		Ports: &config.PortsBlock{API: apiPort, Raft: ptr(*apiPort + 1), Gossip: ptr(*apiPort + 2)},
		Server: &config.ServerBlock{BootstrapExpect: ptr(1),
			// LoadBalancer Services answer on this machine out of the box (devpool.go).
			LoadBalancer: &config.LoadBalancerBlock{Pool: []string{devLoadBalancerPool(dir)}}},
	}
	cfg, err := config.LoadServer("", flags)
	if err != nil {
		fmt.Fprintf(os.Stderr, "skiff dev: %v\n", err)
		return 1
	}
	logger, tail := newLogger(cfg.LogLevel, false, true)
	srv, err := server.New(cfg, logger, server.Options{LocalGossip: true, LogTail: tail.Bytes})
	if err != nil {
		logger.Error("starting dev server", "error", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "\nSkiff dev cluster starting. Once ready:\n  export KUBECONFIG=%s\n  kubectl run hello --image=%s -- sleep 3600\n  kubectl get pods -w\n\n", srv.KubeconfigPath(), images.OfflineBusyboxRef)
	ctx, stopAgent := context.WithCancel(context.Background())
	defer stopAgent()
	agentDone := make(chan struct{})
	var agentCfg *config.Agent
	if *runtime == "none" {
		close(agentDone)
	} else if agentCfg, err = startDevAgent(ctx, dir, *apiPort, *runtime, logger, agentDone); err != nil {
		logger.Error("starting the dev node agent", "error", err)
		srv.Shutdown()
		return 1
	}
	return waitForShutdown(srv, logger, func() {
		stopAgent()
		<-agentDone
		// A temporary data dir goes at exit, so its pods must go first: containers, network and IPs.
		if *dataDir == "" && agentCfg != nil && agentCfg.Runtime == config.RuntimeContainerd {
			if err := nodeagent.Teardown(context.Background(), agentCfg, logger.Named("teardown")); err != nil {
				logger.Warn("removing the dev node's pods", "error", err)
			}
		}
	})
}

// startDevAgent runs a node agent named "dev" in this process, joined with the server's own join token.
func startDevAgent(ctx context.Context, dir string, apiPort int, runtime string, logger hclog.Logger, done chan struct{}) (*config.Agent, error) {
	token, err := readJoinToken(ctx, filepath.Join(dir, "join-token"))
	if err != nil {
		return nil, err
	}
	agentDir := filepath.Join(dir, "agent")
	if err := os.MkdirAll(filepath.Join(agentDir, "images"), 0o700); err != nil {
		return nil, err
	}
	if runtime == config.RuntimeContainerd {
		if err := images.WriteOfflineBusybox(filepath.Join(agentDir, "images", "busybox.tar")); err != nil {
			logger.Warn("no busybox image for the dev node", "error", err)
		}
	}
	cfg, err := config.LoadAgent("", &config.AgentFile{
		Name: ptr("dev"), DataDir: &agentDir, BindAddr: ptr("127.0.0.1"),
		Agent: &config.AgentBlock{Servers: []string{fmt.Sprintf("127.0.0.1:%d", apiPort)}, Token: &token, Runtime: &runtime},
	})
	if err != nil {
		return nil, err
	}
	agent, err := nodeagent.New(cfg, logger.Named("agent"))
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(done)
		if err := agent.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error("dev node agent stopped", "error", err)
		}
	}()
	return cfg, nil
}

// readJoinToken waits for the server to write its join token at start-up.
func readJoinToken(ctx context.Context, path string) (string, error) {
	for {
		data, err := os.ReadFile(path)
		if err == nil && len(strings.TrimSpace(string(data))) > 0 {
			return strings.TrimSpace(string(data)), nil
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func ptr[T any](v T) *T { return &v }
