// TLS and mutual TLS with certificates made by openssl inside the test.
#include <cstdlib>
#include <filesystem>

#include <gtest/gtest.h>

#include "integration/server_fixture.h"
#include "test_util/fixtures.h"

namespace streambp {
namespace {

class Tls : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("tls");
    // A CA, a server certificate for localhost/127.0.0.1 and a client certificate, both
    // signed by the CA; and a second CA that signs nothing we trust.
    const std::string script =
        "set -e; cd '" + dir_ + "';"
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca 2>/dev/null;"
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem -days 2 -subj /CN=other-ca 2>/dev/null;"
        "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext;"
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=localhost 2>/dev/null;"
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
        "-extfile san.ext 2>/dev/null;"
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=client 2>/dev/null;"
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 2>/dev/null;";
    ASSERT_EQ(std::system(("bash -c \"" + script + "\"").c_str()), 0) << "openssl failed";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  server::ServerConfig Config(bool mutual) const {
    auto c = testing::TestConfig();
    c.tls.cert = dir_ + "/server.pem";
    c.tls.key = dir_ + "/server.key";
    if (mutual) c.tls.client_ca = dir_ + "/ca.pem";
    return c;
  }
  std::unique_ptr<client::Client> Connect(int port, const std::string& ca, bool with_cert, bool tls = true) const {
    client::ClientOptions o;
    o.target = "localhost:" + std::to_string(port);
    o.tls.enabled = tls;
    o.tls.root_ca_file = ca.empty() ? "" : dir_ + "/" + ca;
    if (with_cert) {
      o.tls.cert_file = dir_ + "/client.pem";
      o.tls.key_file = dir_ + "/client.key";
    }
    o.retry.max_attempts = 1;
    o.info_timeout = std::chrono::seconds(5);
    return client::Client::Create(o);
  }
  std::string dir_;
};

TEST_F(Tls, ServerAuthenticatedByItsCa) {
  auto s = testing::StartServer(Config(false), [&] {
    client::ClientOptions o;
    o.tls.enabled = true;
    o.tls.root_ca_file = dir_ + "/ca.pem";
    o.tls.server_name_override = "localhost";
    return o;
  }());
  EXPECT_TRUE(s.client->GetInfo().ok()) << s.client->GetInfo().status().error_message();
  EXPECT_TRUE(Connect(s.server->port(), "ca.pem", false)->GetInfo().ok());
  // A client that trusts another CA, or speaks plaintext, gets nothing.
  EXPECT_FALSE(Connect(s.server->port(), "other.pem", false)->GetInfo().ok());
  EXPECT_FALSE(Connect(s.server->port(), "", false, false)->GetInfo().ok());
}

TEST_F(Tls, MutualTlsRequiresAClientCertificate) {
  auto s = testing::StartServer(Config(true), [&] {
    client::ClientOptions o;
    o.tls.enabled = true;
    o.tls.root_ca_file = dir_ + "/ca.pem";
    o.tls.cert_file = dir_ + "/client.pem";
    o.tls.key_file = dir_ + "/client.key";
    o.tls.server_name_override = "localhost";
    return o;
  }());
  EXPECT_TRUE(s.client->GetInfo().ok()) << s.client->GetInfo().status().error_message();
  EXPECT_TRUE(Connect(s.server->port(), "ca.pem", true)->GetInfo().ok());
  auto without = Connect(s.server->port(), "ca.pem", false)->GetInfo();
  EXPECT_FALSE(without.ok());
  EXPECT_EQ(without.code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace streambp
