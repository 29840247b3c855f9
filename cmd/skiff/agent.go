package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/nodeagent"
)

func runAgent(args []string) int {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	configPath := fs.String("config", "", "HCL configuration file")
	name := fs.String("name", "", "node name (overrides the file)")
	dataDir := fs.String("data-dir", "", "data directory (overrides the file)")
	teardown := fs.Bool("teardown", false, "remove every pod, network namespace, IP, the bridge and the masquerade chain this agent made on the host, then exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	flags := &config.AgentFile{}
	if *name != "" {
		flags.Name = name
	}
	if *dataDir != "" {
		flags.DataDir = dataDir
	}
	if *teardown {
		// Teardown works on the host alone: it needs no servers and no token, which validation would demand.
		flags.Agent = &config.AgentBlock{Servers: []string{"127.0.0.1:1"}, Token: ptr("unused-by-teardown")}
	}
	cfg, err := config.LoadAgent(*configPath, flags)
	if err != nil {
		fmt.Fprintf(os.Stderr, "skiff agent: invalid configuration:\n%v\n", err)
		return 1
	}
	logger, _ := newLogger(cfg.LogLevel, cfg.LogJSON, false)
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		logger.Error("creating the data directory", "error", err)
		return 1
	}
	if *teardown {
		if err := nodeagent.Teardown(context.Background(), cfg, logger.Named("teardown")); err != nil {
			logger.Error("teardown", "error", err)
			return 1
		}
		return 0
	}
	agent, err := nodeagent.New(cfg, logger.Named("agent"))
	if err != nil {
		logger.Error("starting agent", "error", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := agent.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		logger.Error("agent stopped", "error", err)
		return 1
	}
	logger.Info("agent stopped")
	return 0
}
