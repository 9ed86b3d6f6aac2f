def test_login_page_renders(client, db):
    response = client.get("/login/")
    assert response.status_code == 200
    assert b"Log in" in response.content
