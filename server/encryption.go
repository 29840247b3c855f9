package server

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/server/options/encryptionconfig"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/fsm"
)

// Encryption at rest. The API's storage and the server's own secrets in the store (the cluster CA, the
// tokens, the service account key, the gossip keyring) go through the transformers of a Kubernetes
// EncryptionConfiguration, so the Raft log, its snapshots and `snapshot save` files hold them encrypted.
//
// The file is either the operator's (server.encryption_config), or Skiff's own under the data dir
// (managedEncryptionFile): the first server of a new cluster draws it with a fresh secretbox key, as it draws
// the cluster CA, and every server that joins gets it in the server join. k3s's --secrets-encryption is the
// model. A data dir that predates encryption at rest has no such file, and its cluster stores values as
// they are until the operator names a file.
const managedEncryptionFile = "encryption-config.yaml"

// secretsResource is the resource whose transformer also seals the server's own secrets.
var secretsResource = schema.GroupResource{Resource: "secrets"}

// encryptionAtRest holds the transformers in use; they can change while the server runs (a rotation, or the
// file arriving with the server join), so what it hands out looks them up at each call.
type encryptionAtRest struct {
	path    string // the EncryptionConfiguration file; "" when encryption at rest is off
	managed bool   // the file is Skiff's own: drawn, handed to joining servers, rotated
	name    string // this server's name, for the library's loader

	mu      sync.Mutex // serializes changes of the file
	current atomic.Pointer[resourceTransformers]
}

type resourceTransformers struct{ value.ResourceTransformers }

func newEncryptionAtRest(cfg *config.Server) (*encryptionAtRest, error) {
	e := &encryptionAtRest{name: cfg.Name}
	switch {
	case cfg.EncryptionConfig != "":
		e.path = cfg.EncryptionConfig
	case cfg.SecretsEncryption:
		e.path, e.managed = filepath.Join(cfg.DataDir, managedEncryptionFile), true
		if _, err := os.Stat(e.path); errors.Is(err, os.ErrNotExist) {
			return e, nil // drawn or received before Raft can run (obtainRaftPKI)
		}
	default:
		return e, nil
	}
	return e, e.load()
}

// load reads the file with kube-apiserver's own loader: the same format, validation and providers (aescbc,
// aesgcm, secretbox, identity). KMS providers are refused: they need a plugin process Skiff does not run.
func (e *encryptionAtRest) load() error {
	// The context stops what KMS providers start; the static providers start nothing and keep working.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := encryptionconfig.LoadEncryptionConfig(ctx, e.path, false, e.name)
	if err != nil {
		return fmt.Errorf("encryption configuration %s: %w", e.path, err)
	}
	if len(cfg.HealthChecks) > 0 {
		return fmt.Errorf("encryption configuration %s: KMS providers are not supported: use aescbc, aesgcm or secretbox", e.path)
	}
	e.current.Store(&resourceTransformers{encryptionconfig.StaticTransformers(cfg.Transformers)})
	return nil
}

// TransformerForResource is value.ResourceTransformers: a transformer that follows the file's changes.
func (e *encryptionAtRest) TransformerForResource(gr schema.GroupResource) value.Transformer {
	return &followingTransformer{e: e, gr: gr}
}

func (e *encryptionAtRest) transformerFor(gr schema.GroupResource) value.Transformer {
	if t := e.current.Load(); t != nil {
		return t.TransformerForResource(gr)
	}
	return identity.NewEncryptCheckTransformer()
}

type followingTransformer struct {
	e  *encryptionAtRest
	gr schema.GroupResource
}

func (f *followingTransformer) TransformFromStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, bool, error) {
	return f.e.transformerFor(f.gr).TransformFromStorage(ctx, data, dataCtx)
}

func (f *followingTransformer) TransformToStorage(ctx context.Context, data []byte, dataCtx value.Context) ([]byte, error) {
	return f.e.transformerFor(f.gr).TransformToStorage(ctx, data, dataCtx)
}

// draw writes a managed file with a fresh key, unless there is one (an operator may have put back the file
// of a cluster whose snapshot this one will restore).
func (e *encryptionAtRest) draw() error {
	if !e.managed {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := os.Stat(e.path); err == nil {
		return e.load()
	}
	body, err := managedConfig([]string{newKeyName()}, nil)
	if err != nil {
		return err
	}
	return e.writeLocked(body)
}

// managedFile is the managed file's contents, for a joining server; nil when this server has none.
func (e *encryptionAtRest) managedFile() []byte {
	if !e.managed {
		return nil
	}
	b, _ := os.ReadFile(e.path)
	return b
}

// receive installs the managed file the server join handed over.
func (e *encryptionAtRest) receive(body []byte) error {
	if !e.managed || len(body) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.writeLocked(body)
}

// writeLocked checks a new file by loading it from a temporary copy, then puts it in place and loads it.
func (e *encryptionAtRest) writeLocked(body []byte) error {
	tmp := e.path + ".new"
	if err := os.WriteFile(tmp, body, 0o600); err != nil {
		return err
	}
	check := &encryptionAtRest{path: tmp, name: e.name}
	if err := check.load(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, e.path); err != nil {
		return err
	}
	e.current.Store(check.current.Load())
	return nil
}

// managedConfig is the managed EncryptionConfiguration: Secrets with secretbox under the named keys, the first
// one writing; keys holds their secrets by name, and a name without one gets a fresh key. identity comes last,
// so values stored before encryption was on still read (and are rewritten by a rotation).
func managedConfig(names []string, keys map[string]string) ([]byte, error) {
	out := "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: [secrets]\n  providers:\n  - secretbox:\n      keys:\n"
	for _, name := range names {
		secret, ok := keys[name]
		if !ok {
			raw := make([]byte, 32)
			if _, err := rand.Read(raw); err != nil {
				return nil, err
			}
			secret = base64.StdEncoding.EncodeToString(raw)
		}
		out += fmt.Sprintf("      - name: %s\n        secret: %s\n", name, secret)
	}
	return []byte(out + "  - identity: {}\n"), nil
}

// newKeyName names a key by when it was drawn, so `secrets-encrypt status` shows its age.
func newKeyName() string { return "key-" + time.Now().UTC().Format("20060102t150405") }

// openSecret reads one of the server's own secrets from the store, decrypted.
func (s *Server) openSecret(key string) ([]byte, *fsm.KeyValue, error) {
	kv, _, err := s.node.Store().Get(key)
	if err != nil {
		return nil, nil, err
	}
	plain, _, err := s.enc.transformerFor(secretsResource).TransformFromStorage(context.Background(), kv.Value, value.DefaultContext(key))
	if err != nil {
		return nil, kv, fmt.Errorf("cannot decrypt %s: check the servers' encryption configuration (its keys must include the one that wrote it): %w", key, err)
	}
	return plain, kv, nil
}

// sealSecret is what the store holds for one of the server's own secrets.
func (s *Server) sealSecret(key string, plain []byte) ([]byte, error) {
	return s.enc.transformerFor(secretsResource).TransformToStorage(context.Background(), plain, value.DefaultContext(key))
}
