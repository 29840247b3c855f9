package gossip

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/freeport"
)

func TestKeyFromSecret(t *testing.T) {
	a, b := KeyFromSecret("cluster-secret-0123456789"), KeyFromSecret("cluster-secret-0123456789")
	if len(a) != 32 || !bytes.Equal(a, b) {
		t.Fatalf("derived keys %x and %x: want the same 32 bytes", a, b)
	}
	if bytes.Equal(a, KeyFromSecret("another-secret-0123456789")) {
		t.Fatal("two secrets derive the same key")
	}
}

func TestKeyringNormalize(t *testing.T) {
	k1, k2 := EncodeKey(bytes.Repeat([]byte{1}, 32)), EncodeKey(bytes.Repeat([]byte{2}, 16))
	cases := []struct {
		name    string
		ring    Keyring
		want    Keyring
		wantErr bool
	}{
		{"primary added to keys", Keyring{Primary: k2, Keys: []string{k1}}, Keyring{Primary: k2, Keys: []string{k1, k2}}, false},
		{"duplicates dropped", Keyring{Primary: k1, Keys: []string{k1, k1}}, Keyring{Primary: k1, Keys: []string{k1}}, false},
		{"no primary", Keyring{Keys: []string{k1}}, Keyring{}, true},
		{"bad key", Keyring{Primary: k1, Keys: []string{"c2hvcnQ="}}, Keyring{}, true},
		{"not base64", Keyring{Primary: "not base64!"}, Keyring{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.ring.Normalize()
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && (got.Primary != tc.want.Primary || fmt.Sprint(got.Keys) != fmt.Sprint(tc.want.Keys)) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if (Keyring{Primary: k1, Keys: []string{k2}}).Hash() != (Keyring{Primary: k1, Keys: []string{k2, k1}}).Hash() {
		t.Fatal("equal keyrings hash differently")
	}
	if (Keyring{Primary: k1, Keys: []string{k2}}).Hash() == (Keyring{Primary: k2, Keys: []string{k1}}).Hash() {
		t.Fatal("keyrings with different primaries hash the same")
	}
}

// TestKeyringRotation: two members with the key derived from the same secret gossip; a new key installed on
// both, used, and the old one removed, they are still members of one pool, and a restart keeps the rotated
// keyring. A member with the old key only, or another secret's, cannot join.
func TestKeyringRotation(t *testing.T) {
	secret := "cluster-secret-0123456789"
	ports := []int{freeport.One(t), freeport.One(t)}
	dirs := []string{t.TempDir(), t.TempDir()}
	start := func(name string, i int, join []string, defaultKey []byte, retryMax int) *Pool {
		t.Helper()
		p, err := New(Config{Name: name, BindAddr: "127.0.0.1", BindPort: ports[i], RetryJoin: join,
			RetryInterval: 50 * time.Millisecond, RetryMax: retryMax, Local: true, Meta: Meta{Role: RoleServer},
			DefaultKey: defaultKey, KeyringFile: filepath.Join(dirs[i], KeyringFileName)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		return p
	}
	join := []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}
	a := start("m0", 0, nil, KeyFromSecret(secret), 0)
	b := start("m1", 1, join, KeyFromSecret(secret), 0)
	waitFor(t, "the two members to see each other", func() bool { return len(a.Alive("")) == 2 && len(b.Alive("")) == 2 })
	old := EncodeKey(KeyFromSecret(secret))
	if ring, err := a.Keyring(); err != nil || ring.Primary != old || len(ring.Keys) != 1 {
		t.Fatalf("a's keyring at start: %+v, %v; want the derived key only", ring, err)
	}
	if _, err := os.Stat(filepath.Join(dirs[0], KeyringFileName)); !os.IsNotExist(err) {
		t.Fatalf("a keyring file was written before any change: %v", err)
	}

	next := EncodeKey(bytes.Repeat([]byte{7}, 32))
	steps := []struct {
		name string
		ring Keyring
	}{
		{"install", Keyring{Primary: old, Keys: []string{old, next}}},
		{"use", Keyring{Primary: next, Keys: []string{old, next}}},
		{"remove", Keyring{Primary: next, Keys: []string{next}}},
	}
	for _, step := range steps {
		for _, p := range []*Pool{a, b} {
			if changed, err := p.SetKeyring(step.ring); err != nil || !changed {
				t.Fatalf("%s: SetKeyring = %v, %v", step.name, changed, err)
			}
			if changed, err := p.SetKeyring(step.ring); err != nil || changed {
				t.Fatalf("%s again: SetKeyring = %v, %v; want no change", step.name, changed, err)
			}
		}
		waitFor(t, step.name+": each member to see the other's keyring hash", func() bool {
			ma, _ := b.Member("m0")
			mb, _ := a.Member("m1")
			return ma.Meta.KeyringHash == step.ring.Hash() && mb.Meta.KeyringHash == step.ring.Hash()
		})
	}
	// Still one pool under the new key only: a metadata change travels, and both stay alive.
	if err := b.UpdateMeta(Meta{Role: RoleServer, RaftAddr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b's metadata change to reach a", func() bool { m, _ := a.Member("m1"); return m.Meta.RaftAddr == "127.0.0.1:1" })
	// Probes run under the new key too: a failing one would have made a member suspect, then dead, by now.
	time.Sleep(2 * a.SuspicionTimeout())
	if len(a.Alive("")) != 2 || len(b.Alive("")) != 2 {
		t.Fatalf("after the rotation: a sees %d alive, b sees %d", len(a.Alive("")), len(b.Alive("")))
	}
	if ring, found, err := ReadKeyringFile(filepath.Join(dirs[1], KeyringFileName)); err != nil || !found || ring.Hash() != steps[2].ring.Hash() {
		t.Fatalf("b's keyring file: %+v, %v, %v", ring, found, err)
	}
	if info, err := os.Stat(filepath.Join(dirs[1], KeyringFileName)); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("b's keyring file mode: %v, %v", info, err)
	}

	// A restart reads the keyring file, not the derived key, and rejoins.
	b.Shutdown()
	b = start("m1", 1, join, KeyFromSecret(secret), 0)
	waitFor(t, "the restarted member to rejoin with the rotated key", func() bool { return len(b.Alive("")) == 2 })

	// Members with the removed key, or another secret's, are refused.
	for _, key := range [][]byte{KeyFromSecret(secret), KeyFromSecret("another-secret-0123456789")} {
		dirs[1], ports[1] = t.TempDir(), freeport.One(t)
		c := start("intruder", 1, join, key, 3)
		select {
		case <-c.JoinFailed():
		case <-c.Joined():
			t.Fatalf("a member with key %s joined", EncodeKey(key))
		case <-time.After(20 * time.Second):
			t.Fatal("the join attempts neither failed nor succeeded")
		}
		c.Shutdown()
	}
	if len(a.Alive("")) != 2 {
		t.Fatalf("a member with a wrong key got in: %+v", a.Alive(""))
	}
}

// TestKeyringFilePreferred: a member whose keyring file exists starts with it, whatever `encrypt` says; a
// member without encryption cannot be given a keyring.
func TestKeyringFilePreferred(t *testing.T) {
	path := filepath.Join(t.TempDir(), KeyringFileName)
	k1, k2 := EncodeKey(bytes.Repeat([]byte{1}, 32)), EncodeKey(bytes.Repeat([]byte{2}, 32))
	want := Keyring{Primary: k2, Keys: []string{k1, k2}}
	if err := writeKeyringFile(path, want); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Name: "a", BindAddr: "127.0.0.1", BindPort: freeport.One(t), Local: true, EncryptKey: k1, KeyringFile: path})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown()
	if got, err := p.Keyring(); err != nil || got.Hash() != want.Hash() {
		t.Fatalf("keyring %+v, %v; want the file's %+v", got, err, want)
	}
	plain, err := New(Config{Name: "b", BindAddr: "127.0.0.1", BindPort: freeport.One(t), Local: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Shutdown()
	if _, err := plain.SetKeyring(want); err != ErrNotEncrypted {
		t.Fatalf("SetKeyring on an unencrypted member: %v", err)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Name: "c", BindAddr: "127.0.0.1", BindPort: freeport.One(t), Local: true, KeyringFile: path}); err == nil {
		t.Fatal("a member started with an unreadable keyring file")
	}
}
