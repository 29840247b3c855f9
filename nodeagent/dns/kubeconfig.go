package dns

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Credentials are how the node's DNS process authenticates: as the node, by the file of its client
// certificate and key (client-go rereads it after a renewal), or by a bearer token.
type Credentials struct {
	ClientCert string
	Token      string
}

// WriteKubeconfig writes the kubeconfig CoreDNS's kubernetes plugin reads: the API through the forwarder at
// addr (host:port), verified against the cluster CA under the name every server's certificate carries
// ("kubernetes"), with the node's credentials. The file is private (0600): it may hold a credential.
func WriteKubeconfig(path, addr string, caPEM []byte, creds Credentials) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["skiff"] = &clientcmdapi.Cluster{Server: "https://" + addr, CertificateAuthorityData: caPEM, TLSServerName: "kubernetes"}
	cfg.AuthInfos["coredns"] = &clientcmdapi.AuthInfo{Token: creds.Token, ClientCertificate: creds.ClientCert, ClientKey: creds.ClientCert}
	cfg.Contexts["skiff"] = &clientcmdapi.Context{Cluster: "skiff", AuthInfo: "coredns"}
	cfg.CurrentContext = "skiff"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing the DNS kubeconfig: %w", err)
	}
	return nil
}
