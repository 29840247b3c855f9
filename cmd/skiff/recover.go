package main

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/raftnode"
)

// raftRecover makes a stopped server, the survivor of a lost quorum, a cluster of its own: it rewrites the
// Raft configuration in its data dir to the server alone (hashicorp/raft's RecoverCluster). It runs on the
// server's host, with its HCL file, while the server is stopped.
func raftRecover(_ *opClient, args []string) error {
	cfg, err := config.LoadServer(args[0], nil)
	if err != nil {
		return err
	}
	self := raftnode.Server{ID: cfg.Name, Address: cfg.AdvertiseRaftAddr()}
	fmt.Fprintf(os.Stderr, `Recovering %s as a cluster of one server.
This replays every entry in its Raft log, including writes the lost servers may never have committed: those
become committed now. Use it only when a majority of the servers is gone for good.
`, cfg.Name)
	logger := hclog.New(&hclog.LoggerOptions{Name: "recover", Level: hclog.Warn, Output: os.Stderr})
	report, err := raftnode.Recover(cfg.DataDir, []raftnode.Server{self}, logger)
	if err != nil {
		return err
	}
	fmt.Printf("recovered %s: its state through Raft index %d, with %s (%s) as the only voter.\n", cfg.DataDir, report.LastIndex, self.ID, self.Address)
	fmt.Println("Start the server; new servers join it by retry_join and the leader adds them as voters.")
	return nil
}
