package raftnode_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

var chaosRounds = flag.Int("chaos.rounds", 3, "fault rounds in TestChaos (make chaos raises it)")

// TestChaos writes from several clients through random peers while peers are killed, restarted and
// partitioned at random. Afterwards every acknowledged write must be present on every peer, every key's value
// must be one some client wrote, and all stores must be byte-identical.
func TestChaos(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewSource(seed))
	c := rt.TestCluster(t, 3)
	stop := make(chan struct{})
	var mu sync.Mutex
	acked := map[string]string{}
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("/chaos/%d/%d", w, i%50)
				val := fmt.Sprintf("%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				n := c.Node((w + i) % 3)
				var err error
				var res fsm.Result
				if n == nil {
					err = fmt.Errorf("stopped")
				} else {
					res, err = n.Apply(ctx, &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: key, Value: []byte(val)}}}})
				}
				cancel()
				if err == nil && res.Err() == nil {
					mu.Lock()
					// Each worker owns its keys and writes them in order, so the last ack is the value.
					acked[key] = val
					mu.Unlock()
				} else {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	for round := 0; round < *chaosRounds; round++ {
		victim := r.Intn(3)
		switch r.Intn(3) {
		case 0: // crash and restart
			c.Stop(victim)
			time.Sleep(time.Duration(200+r.Intn(800)) * time.Millisecond)
			c.Start(victim)
		case 1: // isolate one peer
			var others []string
			for i := 0; i < 3; i++ {
				if i != victim {
					others = append(others, c.Config(i).BindAddr)
				}
			}
			c.Net.Partition([]string{c.Config(victim).BindAddr}, others)
			time.Sleep(time.Duration(300+r.Intn(900)) * time.Millisecond)
			c.Net.Heal()
		case 2: // kill the leader
			if l := c.Leader(); l >= 0 {
				c.Stop(l)
				time.Sleep(time.Duration(200+r.Intn(600)) * time.Millisecond)
				c.Start(l)
			}
		}
		time.Sleep(time.Duration(200+r.Intn(400)) * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	c.WaitForLeader()
	// A final write through the leader, then every peer must hold it: they have applied the same log.
	if _, err := c.Put(c.WaitForLeader(), "/chaos/final", "x"); err != nil {
		t.Fatal(err)
	}
	c.WaitForIdenticalStores(20 * time.Second)
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged during the storm")
	}
	for key, val := range acked {
		kv, _, err := c.Node(0).Store().Get(key)
		if err != nil {
			t.Fatalf("acknowledged key %s lost", key)
		}
		// A later write to the key may have committed without its ack reaching the client (unknown outcome),
		// so the stored value may be newer than the last ack, never older.
		var w, i, sw, si int
		fmt.Sscanf(val, "%d-%d", &w, &i)
		fmt.Sscanf(string(kv.Value), "%d-%d", &sw, &si)
		if sw != w || si < i {
			t.Fatalf("key %s holds %q, older than acknowledged %q", key, kv.Value, val)
		}
	}
	t.Logf("%d keys acknowledged across %d fault rounds", len(acked), *chaosRounds)
}
