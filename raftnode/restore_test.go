package raftnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// TestRestoreSnapshotOfAnotherCluster is a disaster restore: a snapshot of a cluster far along its log is
// restored into a new cluster whose log is short. The restore succeeds on every peer, and a write after it
// gets a higher revision than every restored key, before and after the peers restart.
func TestRestoreSnapshotOfAnotherCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := rt.TestCluster(t, 1)
	l := old.WaitForLeader()
	for i := range 200 {
		old.MustPut(l, fmt.Sprintf("/k/%03d", i), "v")
	}
	path := filepath.Join(t.TempDir(), "backup.snap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.Node(l).SaveSnapshot(ctx, f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	oldRevision := old.Node(l).Store().Revision()
	old.StopAll()

	fresh := rt.TestCluster(t, 3)
	l = fresh.WaitForLeader()
	if last := fresh.Node(l).RaftForTest().LastIndex(); int64(last) >= oldRevision {
		t.Fatalf("the new cluster's log (%d) is not behind the snapshot's revision (%d): the test tests nothing", last, oldRevision)
	}
	if _, err := fresh.Node(l).RestoreSnapshot(ctx, path); err != nil {
		t.Fatal(err)
	}
	fresh.WaitForIdenticalStores(20 * time.Second)
	check := func(when string) {
		t.Helper()
		l := fresh.WaitForLeader()
		res, err := fresh.Put(l, "/after", when)
		if err != nil {
			t.Fatalf("%s: a write: %v", when, err)
		}
		got := fresh.Node(l).Store().Range("/k/", "", 0)
		if len(got.KVs) != 200 {
			t.Fatalf("%s: %d keys restored, want 200", when, len(got.KVs))
		}
		for _, kv := range got.KVs {
			if kv.ModRevision >= res.Revision || kv.CreateRevision > kv.ModRevision {
				t.Fatalf("%s: restored key %s has revisions %d/%d, a later write %d", when, kv.Key, kv.CreateRevision, kv.ModRevision, res.Revision)
			}
		}
	}
	check("after the restore")
	fresh.StopAll()
	for i := range fresh.Size() {
		fresh.Start(i)
	}
	check("after a restart")
	fresh.WaitForIdenticalStores(20 * time.Second)
}
