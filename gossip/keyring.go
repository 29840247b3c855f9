package gossip

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// KeyringFileName is the name members give their keyring file (Config.KeyringFile) under their data dir.
const KeyringFileName = "gossip-keyring.json"

// keyInfo binds the derived key to its use: the same secret keys other things too (the CA's HMAC).
const keyInfo = "skiff gossip key v1"

// KeyFromSecret derives a 32-byte gossip key from a shared secret (the cluster token's), with HKDF-SHA256.
// Every member that knows the secret derives the same key, so gossip is encrypted without an `encrypt` key.
func KeyFromSecret(secret string) []byte {
	key, err := hkdf.Key(sha256.New, []byte(secret), nil, keyInfo, 32)
	if err != nil {
		panic(err) // only for a length HKDF cannot produce
	}
	return key
}

// EncodeKey is a key as operators and files write it: standard base64.
func EncodeKey(key []byte) string { return base64.StdEncoding.EncodeToString(key) }

// ParseKey reads a base64 AES key of 16, 24 or 32 bytes.
func ParseKey(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("gossip key %q is not base64: %w", s, err)
	}
	if err := memberlist.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("gossip key must be 16, 24 or 32 bytes (base64), got %d bytes", len(key))
	}
	return key, nil
}

// Keyring is a gossip keyring as members hand it around and keep it in files: every key a member decrypts
// with, and the primary one it encrypts with. Keys are base64.
type Keyring struct {
	Primary string   `json:"primary"`
	Keys    []string `json:"keys"` // the primary included
}

// Normalize checks the keyring and returns it in canonical form: keys re-encoded, sorted, without
// duplicates, the primary among them. Two keyrings with the same keys and primary are then equal.
func (k Keyring) Normalize() (Keyring, error) {
	if k.Primary == "" {
		return Keyring{}, errors.New("the keyring has no primary key")
	}
	primary, err := ParseKey(k.Primary)
	if err != nil {
		return Keyring{}, err
	}
	out := Keyring{Primary: EncodeKey(primary), Keys: []string{EncodeKey(primary)}}
	for _, s := range k.Keys {
		key, err := ParseKey(s)
		if err != nil {
			return Keyring{}, err
		}
		out.Keys = append(out.Keys, EncodeKey(key))
	}
	slices.Sort(out.Keys)
	out.Keys = slices.Compact(out.Keys)
	return out, nil
}

// Has says whether key (base64) is in the keyring.
func (k Keyring) Has(key string) bool {
	b, err := ParseKey(key)
	return err == nil && slices.Contains(k.Keys, EncodeKey(b))
}

// Hash is a short digest of the normalized keyring, which members publish in their metadata
// (Meta.KeyringHash) so that an operator can tell when every member has applied a keyring. Empty for an
// invalid keyring.
func (k Keyring) Hash() string {
	n, err := k.Normalize()
	if err != nil {
		return ""
	}
	h := sha256.New()
	h.Write([]byte(n.Primary))
	for _, key := range n.Keys {
		h.Write([]byte{0})
		h.Write([]byte(key))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ReadKeyringFile reads a keyring file; ok is false when there is none.
func ReadKeyringFile(path string) (ring Keyring, ok bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Keyring{}, false, nil
	} else if err != nil {
		return Keyring{}, false, err
	}
	if err := json.Unmarshal(data, &ring); err != nil {
		return Keyring{}, false, fmt.Errorf("gossip keyring file %s: %w", path, err)
	}
	if ring, err = ring.Normalize(); err != nil {
		return Keyring{}, false, fmt.Errorf("gossip keyring file %s: %w", path, err)
	}
	return ring, true, nil
}

// writeKeyringFile writes the keyring readable by its owner only, through a rename so that a crash leaves
// the old file or the new, never half.
func writeKeyringFile(path string, ring Keyring) error {
	data, err := json.MarshalIndent(ring, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// initialKeyring is what a member starts with: its keyring file when it has one (written after each change,
// so a restart keeps rotated keys), else cfg.EncryptKey, else cfg.DefaultKey. ok is false when gossip is not
// to be encrypted.
func (p *Pool) initialKeyring() (ring Keyring, ok bool, err error) {
	cfg := p.cfg
	if cfg.KeyringFile != "" {
		ring, found, err := ReadKeyringFile(cfg.KeyringFile)
		if err != nil {
			return Keyring{}, false, err
		}
		if found {
			if cfg.EncryptKey != "" && !sameKey(cfg.EncryptKey, ring.Primary) {
				p.logger.Warn("the gossip keyring file exists and its primary key is not `encrypt`: using the keyring file, ignoring `encrypt`",
					"file", cfg.KeyringFile)
			}
			return ring, true, nil
		}
	}
	primary := ""
	switch {
	case cfg.EncryptKey != "":
		key, err := ParseKey(cfg.EncryptKey)
		if err != nil {
			return Keyring{}, false, err
		}
		primary = EncodeKey(key)
	case len(cfg.DefaultKey) > 0:
		if err := memberlist.ValidateKey(cfg.DefaultKey); err != nil {
			return Keyring{}, false, fmt.Errorf("default gossip key: %w", err)
		}
		primary = EncodeKey(cfg.DefaultKey)
	default:
		return Keyring{}, false, nil
	}
	return Keyring{Primary: primary, Keys: []string{primary}}, true, nil
}

func sameKey(a, b string) bool {
	ka, errA := ParseKey(a)
	kb, errB := ParseKey(b)
	return errA == nil && errB == nil && bytes.Equal(ka, kb)
}

// memberlistKeyring builds memberlist's keyring from a normalized keyring.
func memberlistKeyring(ring Keyring) (*memberlist.Keyring, error) {
	primary, err := ParseKey(ring.Primary)
	if err != nil {
		return nil, err
	}
	var keys [][]byte
	for _, s := range ring.Keys {
		key, err := ParseKey(s)
		if err != nil {
			return nil, err
		}
		keys = append(keys, key)
	}
	return memberlist.NewKeyring(keys, primary)
}

// ErrNotEncrypted is returned by the keyring methods of a pool that started without any key: memberlist
// cannot turn encryption on at run time.
var ErrNotEncrypted = errors.New("gossip is not encrypted on this member (it started without a key)")

// Keyring returns the member's keyring as it is in use now.
func (p *Pool) Keyring() (Keyring, error) {
	kr := p.mlConf.Keyring
	if kr == nil {
		return Keyring{}, ErrNotEncrypted
	}
	keys := kr.GetKeys() // primary first
	if len(keys) == 0 {
		return Keyring{}, ErrNotEncrypted
	}
	ring := Keyring{Primary: EncodeKey(keys[0])}
	for _, k := range keys {
		ring.Keys = append(ring.Keys, EncodeKey(k))
	}
	return ring.Normalize()
}

// SetKeyring makes the member's keyring equal to want, in the order that never cuts a member off during a
// rotation: install the new keys, then switch the primary, then remove the keys want does not list. When
// something changed it rewrites the keyring file and publishes the keyring's hash in the member's metadata.
// It is safe to call concurrently with gossip, and cheap when nothing changes.
func (p *Pool) SetKeyring(want Keyring) (changed bool, err error) {
	want, err = want.Normalize()
	if err != nil {
		return false, err
	}
	p.keyMu.Lock()
	defer p.keyMu.Unlock()
	kr := p.mlConf.Keyring
	if kr == nil {
		return false, ErrNotEncrypted
	}
	have, err := p.Keyring()
	if err != nil {
		return false, err
	}
	if have.Hash() == want.Hash() {
		return false, nil
	}
	for _, s := range want.Keys {
		if !slices.Contains(have.Keys, s) {
			key, _ := ParseKey(s)
			if err := kr.AddKey(key); err != nil {
				return false, err
			}
		}
	}
	primary, _ := ParseKey(want.Primary)
	if want.Primary != have.Primary {
		if err := kr.UseKey(primary); err != nil {
			return true, err
		}
	}
	for _, s := range have.Keys {
		if slices.Contains(want.Keys, s) {
			continue
		}
		key, _ := ParseKey(s)
		// memberlist's RemoveKey shifts the key slice in place, which decryptions running now may be reading;
		// UseKey first gives the ring a fresh slice that no reader holds yet.
		if err := kr.UseKey(primary); err != nil {
			return true, err
		}
		if err := kr.RemoveKey(key); err != nil {
			return true, err
		}
	}
	p.logger.Info("gossip keyring changed", "keys", len(want.Keys), "hash", want.Hash())
	p.mu.Lock()
	p.keyringHash = want.Hash()
	p.mu.Unlock()
	if p.cfg.KeyringFile != "" {
		if err := writeKeyringFile(p.cfg.KeyringFile, want); err != nil {
			return true, fmt.Errorf("writing the gossip keyring file: %w", err)
		}
	}
	if err := p.ml.UpdateNode(5 * time.Second); err != nil {
		p.logger.Warn("announcing the new keyring's hash", "error", err)
	}
	return true, nil
}
