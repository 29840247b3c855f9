package fsm

import (
	"errors"
	"fmt"
	"testing"
)

func TestRangeAtPastRevisions(t *testing.T) {
	a := newApplier(Options{})
	// Remember the full state under the prefix after every entry.
	states := map[int64][]string{}
	record := func() {
		var got []string
		for _, kv := range a.s.Range("/registry/things/", "", 0).KVs {
			got = append(got, kv.Key+"="+string(kv.Value))
		}
		states[a.s.Revision()] = got
	}
	for _, c := range randomCommands(7, 600) {
		a.apply(c)
		record()
	}
	for rev, want := range states {
		// Page through with a small limit, as continue tokens do.
		var got []string
		start := ""
		for {
			page, err := a.s.RangeAt("/registry/things/", start, 7, rev)
			if err != nil {
				t.Fatalf("rev %d: %v", rev, err)
			}
			for _, kv := range page.KVs {
				got = append(got, kv.Key+"="+string(kv.Value))
			}
			if !page.More {
				break
			}
			start = page.KVs[len(page.KVs)-1].Key + "\x00"
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("rev %d:\n got %v\nwant %v", rev, got, want)
		}
	}
	if _, err := a.s.RangeAt("/", "", 0, a.s.Revision()+1); !errors.Is(err, ErrFutureRevision) {
		t.Fatalf("future revision: %v", err)
	}
	small := newApplier(Options{HistoryEvents: 2})
	for i := 0; i < 5; i++ {
		small.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/k/%d", i)})
	}
	if _, err := small.s.RangeAt("/k/", "", 0, 1); !errors.Is(err, ErrCompacted) {
		t.Fatalf("compacted revision: %v", err)
	}
}
