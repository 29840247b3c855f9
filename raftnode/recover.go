package raftnode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/skiff-dev/skiff/fsm"
)

// RecoverReport says what Recover did.
type RecoverReport struct {
	// LastIndex is the index of the last entry of the log replayed: the recovered state includes every
	// entry up to it, committed or not.
	LastIndex uint64
	Servers   []Server
}

// Recover rewrites the Raft configuration of a stopped server (its data dir) to servers, for when a quorum
// is gone for good: hashicorp/raft's RecoverCluster. It restores the newest snapshot, replays the whole log
// on it, and writes a snapshot whose configuration is servers; the server then starts as a cluster of those
// servers. The replay includes entries the lost majority may never have committed, which are committed now.
func Recover(dataDir string, servers []Server, logger hclog.Logger) (RecoverReport, error) {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	if len(servers) == 0 {
		return RecoverReport{}, errors.New("raft recover: no servers to recover to")
	}
	dir := filepath.Join(dataDir, "raft")
	path := filepath.Join(dir, "raft.db")
	if _, err := os.Stat(path); err != nil {
		return RecoverReport{}, fmt.Errorf("raft recover: no Raft state under %s: %w", dir, err)
	}
	logs, err := raftboltdb.New(raftboltdb.Options{Path: path, BoltOptions: &bbolt.Options{Timeout: time.Second}})
	if errors.Is(err, bbolt.ErrTimeout) {
		return RecoverReport{}, fmt.Errorf("raft recover: %s is locked: stop the server first", path)
	} else if err != nil {
		return RecoverReport{}, fmt.Errorf("raft recover: opening %s: %w", path, err)
	}
	defer logs.Close()
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, logger)
	if err != nil {
		return RecoverReport{}, err
	}
	conf := raft.DefaultConfig()
	conf.LocalID = raft.ServerID(servers[0].ID)
	conf.Logger = logger
	var configuration raft.Configuration
	for _, s := range servers {
		configuration.Servers = append(configuration.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.Address)})
	}
	_, trans := raft.NewInmemTransport("")
	replay := &raftFSM{&Node{store: fsm.New(fsm.Options{}), metrics: newMetrics()}}
	if err := raft.RecoverCluster(conf, replay, logs, logs, snaps, trans, configuration); err != nil {
		return RecoverReport{}, fmt.Errorf("raft recover: %w", err)
	}
	written, err := snaps.List()
	if err != nil || len(written) == 0 {
		return RecoverReport{}, fmt.Errorf("raft recover: the recovered snapshot is not there: %v", err)
	}
	return RecoverReport{LastIndex: written[0].Index, Servers: servers}, nil
}
