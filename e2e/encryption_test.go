package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// encryptionConfig is a Kubernetes EncryptionConfiguration that encrypts Secrets with secretbox under one
// named key, and still reads values stored in clear.
func encryptionConfig(keyName string) string {
	key := make([]byte, 32)
	rand.Read(key)
	return fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [secrets]
  providers:
  - secretbox:
      keys:
      - {name: %s, secret: %s}
  - identity: {}
`, keyName, base64.StdEncoding.EncodeToString(key))
}

// storeFiles are the files that hold the Raft store of a server: its log, and its snapshots taken at or
// after the Raft index since (the snapshot directories are named term-index-time).
func storeFiles(t *testing.T, dataDir string, since int) []string {
	t.Helper()
	files := []string{filepath.Join(dataDir, "raft", "raft.db")}
	for _, snap := range snapshotsSince(dataDir, since) {
		files = append(files, filepath.Join(snap, "state.bin"))
	}
	if len(files) == 1 {
		t.Fatalf("no Raft snapshot at or after index %d under %s", since, dataDir)
	}
	return files
}

func snapshotsSince(dataDir string, since int) []string {
	dirs, _ := filepath.Glob(filepath.Join(dataDir, "raft", "snapshots", "*"))
	var out []string
	for _, dir := range dirs {
		parts := strings.Split(filepath.Base(dir), "-")
		if len(parts) != 3 {
			continue
		}
		if index, err := strconv.Atoi(parts[1]); err == nil && index >= since {
			if _, err := os.Stat(filepath.Join(dir, "state.bin")); err == nil {
				out = append(out, dir)
			}
		}
	}
	return out
}

// writeMarkers creates a Secret holding secretMarker and a ConfigMap holding plainMarker, then enough
// other writes for a Raft snapshot past them (the cluster's snapshot_threshold is 16), saves a snapshot,
// and waits for a Raft snapshot that holds both. It returns the saved file and the ConfigMap's Raft index.
func writeMarkers(t *testing.T, c *proctest.Cluster, p *proctest.Proc, secretMarker, plainMarker string) (saved string, index int) {
	t.Helper()
	k := kubectl{t: t, kubeconfig: p.Kubeconfig()}
	k.ok("create", "secret", "generic", "s", "--from-literal=v="+secretMarker)
	k.ok("create", "configmap", "c", "--from-literal=v="+plainMarker)
	// A resourceVersion is the Raft index that wrote the object.
	index, err := strconv.Atoi(k.ok("get", "configmap", "c", "-o", "jsonpath={.metadata.resourceVersion}"))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		k.ok("create", "configmap", fmt.Sprintf("filler-%02d", i), "--from-literal=v=x")
	}
	saved = filepath.Join(t.TempDir(), "backup.snap")
	if out, err := c.Operator(p, "snapshot", "save", saved); err != nil {
		t.Fatalf("snapshot save: %v\n%s", err, out)
	}
	proctest.WaitFor(t, "a Raft snapshot past the markers", 30*time.Second, func() error {
		if len(snapshotsSince(p.Dir, index)) == 0 {
			return fmt.Errorf("none at or after index %d under %s", index, filepath.Join(p.Dir, "raft", "snapshots"))
		}
		return nil
	})
	return saved, index
}

// scanFiles fails the test when a file holds one of the secrets in clear, and when one lacks the control:
// a value the encryption configuration does not cover, which shows the scan can see values. The store
// compresses the values it does not encrypt, so the scan reads each zstd frame in a file decompressed too.
func scanFiles(t *testing.T, files []string, secrets map[string]string, control string) {
	t.Helper()
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, zstdFrames(b)...)
		for what, secret := range secrets {
			if bytes.Contains(b, []byte(secret)) {
				t.Errorf("%s holds %s in clear", path, what)
			}
		}
		if !bytes.Contains(b, []byte(control)) {
			t.Errorf("%s does not hold the ConfigMap's value in clear either: the scan would not see a secret", path)
		}
	}
}

// zstdFrames returns the content of every zstd frame in b, one after the other: wherever the frame magic
// number is, what decodes from there until the decoder meets something that is not zstd.
func zstdFrames(b []byte) []byte {
	magic := []byte{0x28, 0xb5, 0x2f, 0xfd}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		panic(err)
	}
	defer dec.Close()
	var out []byte
	for off := 0; ; off++ {
		i := bytes.Index(b[off:], magic)
		if i < 0 {
			return out
		}
		off += i
		if dec.Reset(bytes.NewReader(b[off:])) == nil {
			content, _ := io.ReadAll(dec) // the frame's content, then an error at what follows it
			out = append(out, content...)
		}
	}
}

const snapshotOften = "raft {\n  snapshot_threshold = 16\n  snapshot_interval = \"1s\"\n}"

// TestSecretsEncryptedAtRest: a server with no encryption settings draws its own key at bootstrap; a
// Secret's value, the admin token, the cluster CA's key and the service account key are then nowhere in
// clear in the Raft log, the Raft snapshots or a `snapshot save` file, while a ConfigMap's value is.
func TestSecretsEncryptedAtRest(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 1, snapshotOften)
	p := c.Procs[0]
	c.Start(p)
	kubectl{t: t, kubeconfig: p.Kubeconfig()}.waitForAPI("default")
	secretMarker := fmt.Sprintf("secret-marker-%d", time.Now().UnixNano())
	plainMarker := fmt.Sprintf("plain-marker-%d", time.Now().UnixNano())
	saved, index := writeMarkers(t, c, p, secretMarker, plainMarker)
	if err := c.Stop(p); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "the drawn encryption configuration", string(mustRead(t, filepath.Join(p.Dir, "encryption-config.yaml"))), "secretbox")
	token := strings.TrimSpace(string(mustRead(t, filepath.Join(p.Dir, "admin-token"))))
	// The CA's key as the CSR signers' file holds it: its base64 body, which a PEM in clear would contain.
	caKey := pemBody(t, mustRead(t, filepath.Join(p.Dir, "pki", "csr-signing", "ca.key")))
	scanFiles(t, append(storeFiles(t, p.Dir, index), saved), map[string]string{"the Secret's value": secretMarker, "the admin token": token,
		"the cluster CA's key": caKey, "a private key": "PRIVATE KEY"}, plainMarker)
}

// TestEncryptionConfigurationFile: with server.encryption_config, the operator's file encrypts Secrets. A
// server restarted with another key (under the same name) refuses to serve, saying it cannot decrypt, and
// overwrites nothing: with the right key back, the Secret reads again.
func TestEncryptionConfigurationFile(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	encPath := filepath.Join(t.TempDir(), "encryption.yaml")
	right := encryptionConfig("key1")
	if err := os.WriteFile(encPath, []byte(right), 0o600); err != nil {
		t.Fatal(err)
	}
	c := proctest.NewCluster(t, 1, fmt.Sprintf("encryption_config = %q\n%s", encPath, snapshotOften))
	p := c.Procs[0]
	c.Start(p)
	k := kubectl{t: t, kubeconfig: p.Kubeconfig()}
	k.waitForAPI("default")
	secretMarker := fmt.Sprintf("secret-marker-%d", time.Now().UnixNano())
	plainMarker := fmt.Sprintf("plain-marker-%d", time.Now().UnixNano())
	saved, index := writeMarkers(t, c, p, secretMarker, plainMarker)
	if err := c.Stop(p); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.Dir, "encryption-config.yaml")); err == nil {
		t.Fatal("a server with the operator's encryption_config drew a file of its own")
	}
	scanFiles(t, append(storeFiles(t, p.Dir, index), saved), map[string]string{"the Secret's value": secretMarker}, plainMarker)

	if err := os.WriteFile(encPath, []byte(encryptionConfig("key1")), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Start(p)
	proctest.WaitFor(t, "the server to say it cannot decrypt", 60*time.Second, func() error {
		out, _ := k.run("get", "secret", "s")
		if !strings.Contains(out, "cannot decrypt") || !strings.Contains(out, "encryption configuration") {
			return fmt.Errorf("kubectl get secret: %s", out)
		}
		return nil
	})
	if err := c.Stop(p); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(encPath, []byte(right), 0o600); err != nil {
		t.Fatal(err)
	}
	c.Start(p)
	k.waitForAPI("default")
	got := k.ok("get", "secret", "s", "-o", "jsonpath={.data.v}")
	if decoded, _ := base64.StdEncoding.DecodeString(got); string(decoded) != secretMarker {
		t.Fatalf("the Secret with the right key back: %q, want %q", decoded, secretMarker)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pemBody is the first line of a PEM block's base64 body.
func pemBody(t *testing.T, pemBytes []byte) string {
	t.Helper()
	lines := strings.Split(string(pemBytes), "\n")
	if len(lines) < 2 || len(lines[1]) < 40 {
		t.Fatalf("not a PEM block: %q", pemBytes)
	}
	return lines[1]
}

// TestSecretsEncryptRotate: `skiff operator secrets-encrypt rotate` on three servers under a Secret write
// load through all of them: no write fails, every server ends with only the new key (in its file too), every
// Secret and server secret is written with it, and every Secret reads the same through every server, also
// after a server restarts.
func TestSecretsEncryptRotate(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	c.HealthyPeers(c.Procs[0], 3)
	rotateMarker := fmt.Sprintf("rotate-marker-%d", time.Now().UnixNano())
	var ks []kubectl
	for _, p := range c.Procs {
		k := kubectl{t: t, kubeconfig: p.Kubeconfig()}
		k.waitForAPI("default")
		ks = append(ks, k)
	}
	for i := range 10 {
		ks[0].ok("create", "secret", "generic", fmt.Sprintf("before-%d", i), fmt.Sprintf("--from-literal=v=%s-%d", rotateMarker, i))
	}
	before, err := c.Operator(c.Procs[0], "secrets-encrypt", "status")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, before)
	}
	oldKey := regexpFind(t, before, `cp-1\s+managed\s+(key-\S+)`)
	for _, p := range c.Procs[1:] {
		regexpFind(t, before, p.Name+`\s+managed\s+(`+oldKey+`)\n`)
	}

	// A writer through the three servers, until the rotation is over.
	stop := make(chan struct{})
	done := make(chan []string)
	writes := 0
	go func() {
		var failed []string
		for i := 0; ; i++ {
			select {
			case <-stop:
				writes = i
				done <- failed
				return
			default:
			}
			k := ks[i%3]
			if out, err := k.run("create", "secret", "generic", fmt.Sprintf("during-%d", i), fmt.Sprintf("--from-literal=v=during-%d", i)); err != nil {
				failed = append(failed, out)
			}
		}
	}()
	out, err := c.Operator(c.Procs[1], "secrets-encrypt", "rotate")
	close(stop)
	failed := <-done
	if err != nil {
		t.Fatalf("rotate: %v\n%s", err, out)
	}
	t.Logf("%d Secret writes through the three servers during the rotation:\n%s", writes, out)
	if len(failed) > 0 {
		t.Errorf("%d writes failed during the rotation: %v", len(failed), failed)
	}
	newKey := regexpFind(t, out, `rotated to key (key-\S+) on`)
	after, err := c.Operator(c.Procs[2], "secrets-encrypt", "status")
	if err != nil {
		t.Fatalf("status: %v\n%s", err, after)
	}
	for _, p := range c.Procs {
		regexpFind(t, after, p.Name+`\s+managed\s+(`+newKey+`)\n`)
		file := string(mustRead(t, filepath.Join(p.Dir, "encryption-config.yaml")))
		if !strings.Contains(file, newKey) || strings.Contains(file, oldKey) {
			t.Errorf("%s's file after the rotation:\n%s", p.Name, file)
		}
	}
	if strings.Contains(after, oldKey) || strings.Contains(after, "identity") {
		t.Fatalf("values still written with the old key, or in clear:\n%s", after)
	}
	regexpFind(t, after, newKey+`\s+(\d+)`)
	// The marker scan after the rotation: no Secret value in clear in any server's Raft log, while a
	// ConfigMap's value is there.
	ks[0].ok("create", "configmap", "plain", "--from-literal=v="+rotateMarker+"-plain")
	proctest.WaitFor(t, "the ConfigMap in every Raft log", 30*time.Second, func() error {
		for _, p := range c.Procs {
			if !bytes.Contains(mustRead(t, filepath.Join(p.Dir, "raft", "raft.db")), []byte(rotateMarker+"-plain")) {
				return fmt.Errorf("not yet in %s's", p.Name)
			}
		}
		return nil
	})
	for _, p := range c.Procs {
		scanFiles(t, []string{filepath.Join(p.Dir, "raft", "raft.db")}, map[string]string{"a Secret's value": rotateMarker + "-0"}, rotateMarker+"-plain")
	}

	check := func() {
		t.Helper()
		for _, k := range ks {
			for i := range 10 {
				got := k.ok("get", "secret", fmt.Sprintf("before-%d", i), "-o", "jsonpath={.data.v}")
				if decoded, _ := base64.StdEncoding.DecodeString(got); string(decoded) != fmt.Sprintf("%s-%d", rotateMarker, i) {
					t.Fatalf("before-%d through %s: %q", i, k.kubeconfig, decoded)
				}
			}
		}
	}
	check()
	if err := c.Stop(c.Procs[0]); err != nil {
		t.Fatal(err)
	}
	c.Start(c.Procs[0])
	ks[0].waitForAPI("default")
	check()
}

func regexpFind(t *testing.T, s, expr string) string {
	t.Helper()
	m := regexp.MustCompile(expr).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("no %q in:\n%s", expr, s)
	}
	return m[1]
}
