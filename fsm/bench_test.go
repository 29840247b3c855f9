package fsm

import (
	"bytes"
	"context"
	"fmt"
	"testing"
)

// BenchmarkApplyCreate measures Apply of 1 KiB creates in batches of 64, as Raft delivers them.
func BenchmarkApplyCreate(b *testing.B) {
	s := New(Options{})
	value := bytes.Repeat([]byte("v"), 1024)
	b.ReportAllocs()
	var index uint64
	for i := 0; i < b.N; i += 64 {
		batch := make([]Entry, 0, 64)
		for j := 0; j < 64; j++ {
			index++
			batch = append(batch, Entry{Index: index, Data: (&Command{Type: CmdCreate, Time: 1, Key: fmt.Sprintf("/registry/pods/ns/p%d", index), Value: value}).Encode()})
		}
		s.ApplyBatch(batch)
	}
}

// BenchmarkRangePage measures one 500-key page of a 10,000-key prefix.
func BenchmarkRangePage(b *testing.B) {
	s := New(Options{})
	for i := 1; i <= 10000; i++ {
		s.Apply(uint64(i), (&Command{Type: CmdCreate, Time: 1, Key: fmt.Sprintf("/registry/pods/ns/p%05d", i), Value: []byte("v")}).Encode())
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if page := s.Range("/registry/pods/", "/registry/pods/ns/p05000", 500); len(page.KVs) != 500 {
			b.Fatal(len(page.KVs))
		}
	}
}

// BenchmarkWatchDelivery measures events delivered to 10 watchers of one prefix.
func BenchmarkWatchDelivery(b *testing.B) {
	s := New(Options{HistoryEvents: 1 << 20})
	ctx := context.Background()
	var watchers []*Watcher
	for i := 0; i < 10; i++ {
		w, _ := s.Watch("/registry/pods/", 0)
		defer w.Close()
		watchers = append(watchers, w)
	}
	b.ResetTimer()
	for i := 1; i <= b.N; i++ {
		s.Apply(uint64(i), (&Command{Type: CmdCreate, Time: 1, Key: fmt.Sprintf("/registry/pods/ns/p%d", i), Value: []byte("v")}).Encode())
		if i%256 == 0 || i == b.N {
			for _, w := range watchers {
				for got := 0; got < (i-1)%256+1; {
					evs, err := w.Next(ctx)
					if err != nil {
						b.Fatal(err)
					}
					got += len(evs)
				}
			}
		}
	}
}
