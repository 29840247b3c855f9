package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/logtail"
	"github.com/skiff-dev/skiff/server"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// serverFlags registers the flags that override a server config file. Only flags the user set end up in the
// returned file struct, so they layer over the file without resetting it.
func serverFlags(fs *flag.FlagSet) (configPath *string, build func() *config.ServerFile) {
	configPath = fs.String("config", "", "path to the server's HCL config file")
	name := fs.String("name", "", "server name (overrides name)")
	dataDir := fs.String("data-dir", "", "data directory (overrides data_dir)")
	bind := fs.String("bind", "", "address every listener binds (overrides bind_addr)")
	advertise := fs.String("advertise", "", "address peers dial (overrides advertise_addr)")
	logLevel := fs.String("log-level", "", "trace, debug, info, warn or error (overrides log_level)")
	expect := fs.Int("bootstrap-expect", 0, "servers to wait for before bootstrapping (overrides server.bootstrap_expect)")
	apiPort := fs.Int("api-port", 0, "API port (overrides ports.api)")
	raftPort := fs.Int("raft-port", 0, "Raft port (overrides ports.raft)")
	gossipPort := fs.Int("gossip-port", 0, "gossip port (overrides ports.gossip)")
	var join stringList
	fs.Var(&join, "retry-join", "gossip address to join, repeatable (overrides server.retry_join)")
	return configPath, func() *config.ServerFile {
		f := &config.ServerFile{Ports: &config.PortsBlock{}, Server: &config.ServerBlock{}}
		set := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		for _, s := range []struct {
			flag string
			val  *string
			dst  **string
		}{{"name", name, &f.Name}, {"data-dir", dataDir, &f.DataDir}, {"bind", bind, &f.BindAddr},
			{"advertise", advertise, &f.AdvertiseAddr}, {"log-level", logLevel, &f.LogLevel}} {
			if set[s.flag] {
				*s.dst = s.val
			}
		}
		for _, i := range []struct {
			flag string
			val  *int
			dst  **int
		}{{"bootstrap-expect", expect, &f.Server.BootstrapExpect}, {"api-port", apiPort, &f.Ports.API},
			{"raft-port", raftPort, &f.Ports.Raft}, {"gossip-port", gossipPort, &f.Ports.Gossip}} {
			if set[i.flag] {
				*i.dst = i.val
			}
		}
		f.Server.RetryJoin = join
		return f
	}
}

// logTailSize is how much of its recent log a server keeps in memory for `skiff operator debug`.
const logTailSize = 4 << 20

// newLogger builds the process's logger, which writes to stderr, and routes the Kubernetes libraries' klog
// output through it. With keepTail, it also keeps its last 4 MiB in memory (the returned tail, else nil).
func newLogger(level string, json, keepTail bool) (hclog.Logger, *logtail.Tail) {
	var tail *logtail.Tail
	var out io.Writer = os.Stderr
	if keepTail {
		tail = logtail.New(logTailSize)
		out = io.MultiWriter(os.Stderr, tail)
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "skiff", Level: hclog.LevelFromString(level), JSONFormat: json, Output: out})
	server.RouteKlog(logger)
	return logger, tail
}

func runServer(args []string) int {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	configPath, flags := serverFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := config.LoadServer(*configPath, flags())
	if err != nil {
		fmt.Fprintf(os.Stderr, "skiff server: invalid configuration:\n%v\n", err)
		return 1
	}
	logger, tail := newLogger(cfg.LogLevel, cfg.LogJSON, true)
	if cfg.MemoryLimit > 0 {
		// Process-wide, so set here and not by server.New: tests run several servers in one process.
		debug.SetMemoryLimit(cfg.MemoryLimit)
		logger.Info("Go memory limit", "bytes", cfg.MemoryLimit)
	}
	srv, err := server.New(cfg, logger, server.Options{LogTail: tail.Bytes})
	if err != nil {
		logger.Error("starting server", "error", err)
		return 1
	}
	return waitForShutdown(srv, logger, nil)
}

// waitForShutdown runs until SIGINT/SIGTERM or removal from the cluster. The first signal shuts down
// gracefully; a second one exits at once, which is safe because every acknowledged write is already fsynced.
// before, when not nil, runs first on a signal (the dev agent stops before its server).
func waitForShutdown(srv *server.Server, logger hclog.Logger, before func()) int {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	select {
	case sig := <-sigs:
		logger.Info("shutting down", "signal", sig.String())
		go func() {
			<-sigs
			logger.Warn("second signal: exiting immediately")
			os.Exit(1)
		}()
		if before != nil {
			before()
		}
		srv.Shutdown()
		return 0
	case <-srv.Removed():
		logger.Warn("removed from the cluster; exiting")
		srv.Shutdown()
		return 3
	}
}
