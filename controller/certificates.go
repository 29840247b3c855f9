package controller

import (
	"context"
	"sync"
	"time"

	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/controller/certificates/approver"
	"k8s.io/kubernetes/pkg/controller/certificates/cleaner"
	"k8s.io/kubernetes/pkg/controller/certificates/signer"
)

// CertificateSigning is what the certificate controllers sign with.
type CertificateSigning struct {
	// CAFile and KeyFile are the cluster CA's certificate and key, PEM; the signers reload them when they
	// change. Empty turns the certificate controllers off.
	CAFile, KeyFile string
	// Duration is the longest a signed certificate lives (a request may ask for less with
	// spec.expirationSeconds, at least 10 minutes): server { node_certificate_ttl }, a year by default, as
	// kube-controller-manager's --cluster-signing-duration.
	Duration time.Duration
}

// buildCertificateControllers builds Kubernetes' own CSR controllers, as kube-controller-manager runs them:
//   - the approver approves node client certificates (signer kubernetes.io/kube-apiserver-client-kubelet,
//     CN system:node:<name>, O system:nodes) when a SubjectAccessReview says the requester may create
//     certificatesigningrequests/nodeclient (bootstrap tokens) or, renewing its own, /selfnodeclient (nodes);
//   - signers issue the approved requests of kube-apiserver-client-kubelet, kube-apiserver-client and
//     kubelet-serving from the cluster CA;
//   - the cleaner deletes requests once they are old (issued after an hour, denied or failed after an
//     hour, pending after a day, and any whose certificate has expired).
func buildCertificateControllers(ctx context.Context, c *Clients) (func(), error) {
	if c.CertificateSigning.CAFile == "" {
		c.Logger.Info("no cluster CA files: certificate signing off")
		return nil, nil
	}
	duration := c.CertificateSigning.Duration
	if duration <= 0 {
		duration = 365 * 24 * time.Hour
	}
	csrs := c.Informers.Certificates().V1().CertificateSigningRequests()
	type runner interface{ Run(context.Context, int) }
	runners := []runner{
		approver.NewCSRApprovingController(ctx, c.Kube, csrs),
		cleaner.NewCSRCleanerController(c.Kube.CertificatesV1().CertificateSigningRequests(), csrs),
	}
	ca, key := c.CertificateSigning.CAFile, c.CertificateSigning.KeyFile
	for _, newSigner := range []func(context.Context, kubernetes.Interface, certificatesinformers.CertificateSigningRequestInformer, string, string, time.Duration) (*signer.CSRSigningController, error){
		signer.NewKubeletClientCSRSigningController,
		signer.NewKubeAPIServerClientCSRSigningController,
		signer.NewKubeletServingCSRSigningController,
	} {
		s, err := newSigner(ctx, c.Kube, csrs, ca, key, duration)
		if err != nil {
			c.Logger.Error("certificate signer not started", "error", err)
			continue
		}
		runners = append(runners, s)
	}
	return func() {
		var wg sync.WaitGroup
		for _, r := range runners {
			wg.Go(func() { r.Run(ctx, 1) })
		}
		wg.Wait()
	}, nil
}
